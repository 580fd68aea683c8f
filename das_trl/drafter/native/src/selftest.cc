#include "selftest.h"

#include <algorithm>
#include <random>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "flat_map.h"
#include "pod_vector.h"
#include "snapshot.h"

namespace das {

std::string selftest_containers(uint64_t seed, int64_t n) {
  if (n > (int64_t{1} << 27))  // ~4 GB of tables and arrays: more would only exhaust the machine's memory
    throw InputError("selftest_containers: n must be <= 2**27, got " + std::to_string(n));
  std::mt19937_64 rng(seed);
  const uint64_t range = 2 * static_cast<uint64_t>(n) + 1;  // about half the operations hit an existing key
  FlatMap<int32_t> map;
  std::unordered_map<uint64_t, int32_t> ref;
  size_t peak_bytes = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = (rng() % range) << 20;  // keys that share their low bits, as (state, token) keys do
    if (rng() % 4) {
      map[key] += 1;
      ref[key] += 1;
    } else {
      const int32_t* v = map.find(key);
      auto it = ref.find(key);
      if ((v == nullptr) != (it == ref.end()) || (v && *v != it->second))
        return "FlatMap: lookup " + std::to_string(i) + " disagrees";
    }
    peak_bytes = std::max(peak_bytes, map.bytes());
  }
  if (map.size() != ref.size()) return "FlatMap: size " + std::to_string(map.size()) + " != " + std::to_string(ref.size());
  for (const auto& [k, v] : ref)
    if (!map.find(k) || *map.find(k) != v) return "FlatMap: key lost after the inserts";
  size_t seen = 0;
  bool bad = false;
  map.for_each([&](uint64_t k, int32_t v) {
    ++seen;
    auto it = ref.find(k);
    bad |= it == ref.end() || it->second != v;
  });
  if (bad || seen != ref.size()) return "FlatMap: for_each visits " + std::to_string(seen) + " keys, not " +
                                        std::to_string(ref.size()) + (bad ? " (or wrong values)" : "");
  // Load <= 1/2 in the live table, old table included while a doubling is in progress: at most 6 slots a key.
  if (peak_bytes > 16 * (6 * ref.size() + 64)) return "FlatMap: " + std::to_string(peak_bytes) + " bytes for " +
                                                      std::to_string(ref.size()) + " keys";

  struct Rec {
    int32_t a, b, c;  // 12 bytes: pages do not hold a whole number of them
  };
  PodVector<Rec> vec;
  std::vector<Rec> want;
  for (int64_t i = 0; i < n; ++i) {
    const Rec r{static_cast<int32_t>(i), static_cast<int32_t>(rng()), static_cast<int32_t>(-i)};
    vec.push_back(r);
    want.push_back(r);
    if (rng() % 1024 == 0) {  // spot-check everything so far
      for (size_t j = 0; j < want.size(); ++j)
        if (vec[j].a != want[j].a || vec[j].b != want[j].b || vec[j].c != want[j].c)
          return "PodVector: element " + std::to_string(j) + " changed after " + std::to_string(i + 1) + " appends";
    }
  }
  if (vec.size() != want.size()) return "PodVector: size";
  for (size_t j = 0; j < want.size(); ++j)
    if (vec[j].a != want[j].a || vec[j].b != want[j].b || vec[j].c != want[j].c) return "PodVector: element lost";
  if (vec.bytes() < want.size() * sizeof(Rec) || vec.bytes() > 2 * want.size() * sizeof(Rec) + 4096)
    return "PodVector: reports " + std::to_string(vec.bytes()) + " bytes for " + std::to_string(want.size()) +
           " records";
  vec.clear();
  if (vec.size() || vec.bytes()) return "PodVector: clear kept memory";
  return "";
}

std::string selftest_snapshot_layout(uint64_t seed, int64_t n, double& sequential_share) {
  sequential_share = 0.0;
  if (n < 1 || n > 4096) throw InputError("selftest_snapshot_layout: n must be in [1, 4096], got " + std::to_string(n));
  std::mt19937_64 rng(seed);
  SequenceSet seqs;
  seqs.offsets.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 50 + static_cast<int64_t>(rng() % 200);
    for (int64_t p = 0; p < len; ++p) {
      const size_t have = seqs.tokens.size();
      if (have > 8 && rng() % 3) {  // copy a stretch written before, as rollouts of one problem repeat each other
        const size_t from = rng() % (have - 8), k = 1 + rng() % 8;
        for (size_t j = 0; j < k && p < len; ++j, ++p) seqs.tokens.push_back(seqs.tokens[from + j]);
        --p;
      } else {
        seqs.tokens.push_back(static_cast<int32_t>(rng() % 50));
      }
    }
    seqs.offsets.push_back(static_cast<int64_t>(seqs.tokens.size()));
  }
  const Snapshot s(seqs, 64, 3, 1);
  if (s.len(0) != 0 || s.link(0) != -1) return "snapshot: state 0 is not the root";
  int64_t with_best = 0, sequential = 0;
  for (int32_t v = 1; v < static_cast<int32_t>(s.num_states()); ++v) {
    if (s.link(v) < 0 || s.len(s.link(v)) >= s.len(v)) return "snapshot: bad suffix link at " + std::to_string(v);
    int32_t tok = 0, tgt = 0;
    if (!s.best(v, tok, tgt)) continue;
    ++with_best;
    if (s.len(tgt) <= s.len(v) || s.find(v, tok) != tgt) return "snapshot: bad best edge at " + std::to_string(v);
    if (tgt == v + 1) ++sequential;
    else if (tgt > v) return "snapshot: the best continuation of state " + std::to_string(v) + " is laid out after it (" +
                             std::to_string(tgt) + "), not next";
  }
  sequential_share = with_best ? static_cast<double>(sequential) / static_cast<double>(with_best) : 0.0;
  return "";
}

}  // namespace das
