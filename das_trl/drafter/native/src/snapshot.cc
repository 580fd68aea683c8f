#include "snapshot.h"

#include <algorithm>
#include <numeric>

#include "automaton.h"

namespace das {

Snapshot::Snapshot(const SequenceSet& seqs, int depth, int gram, uint64_t version)
    : depth_(depth), gram_(gram), version_(version) {
  // 1. Structure, and each position's weight on the state of its prefix.
  Automaton a(depth, /*online_counts=*/false);
  a.reserve(seqs.tokens.size());
  std::vector<int64_t> own;
  own.reserve(2 * seqs.tokens.size() + 1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    Automaton::Cursor cur;
    const int32_t w = seqs.weights.empty() ? 1 : seqs.weights[i];
    for (int64_t p = seqs.offsets[i]; p < seqs.offsets[i + 1]; ++p) {
      a.append(cur, seqs.tokens[p], w);
      if (own.size() < a.num_states()) own.resize(a.num_states(), 0);
      own[cur.last] += w;
    }
    num_tokens_ += seqs.offsets[i + 1] - seqs.offsets[i];
  }
  num_sequences_ = static_cast<int64_t>(seqs.size());
  const auto& st = a.states();
  const int32_t n = static_cast<int32_t>(st.size());
  own.resize(n, 0);
  // 2. Counts: sum over the suffix-link tree, longest states first (counting sort by len).
  int32_t max_len = 0;
  for (const auto& x : st) max_len = std::max(max_len, x.len);
  std::vector<int32_t> bucket(max_len + 2, 0), order(n);
  for (const auto& x : st) ++bucket[x.len + 1];
  for (int32_t i = 1; i <= max_len + 1; ++i) bucket[i] += bucket[i - 1];
  for (int32_t s = 0; s < n; ++s) order[bucket[st[s].len]++] = s;
  for (int32_t i = n - 1; i > 0; --i) {
    int32_t s = order[i];
    own[st[s].link] += own[s];
  }
  // 3. Keep the states holding a string of length <= depth (minlen = len(link) + 1 <= depth), renumbered.
  std::vector<int32_t> id(n, -1);
  int32_t m = 0;
  for (int32_t i = 0; i < n; ++i) {
    int32_t s = order[i];  // shortest first: the root is 0 again
    if (s == 0 || st[st[s].link].len < depth) id[s] = m++;
  }
  st_.assign(m + 1, State{0, -1, 0, 0, -1, -1, 0, 0});
  std::vector<int32_t> old_of(m);
  for (int32_t s = 0; s < n; ++s) {
    if (id[s] < 0) continue;
    State& x = st_[id[s]];
    old_of[id[s]] = s;
    x.len = st[s].len;
    x.link = s == 0 ? -1 : id[st[s].link];
    x.cnt = static_cast<int32_t>(std::min<int64_t>(own[s], INT32_MAX));
  }
  // 4. Edges between kept states, sorted by token; the best one per state (largest count, then smallest token).
  std::vector<std::pair<int32_t, int32_t>> buf;
  edges_.reserve(seqs.tokens.size() + m);
  for (int32_t t = 0; t < m; ++t) {
    buf.clear();
    a.for_each_edge(old_of[t], [&](int32_t tok, int32_t tgt) {
      if (id[tgt] >= 0) buf.emplace_back(tok, id[tgt]);
    });
    std::sort(buf.begin(), buf.end());
    State& x = st_[t];
    x.edge_begin = static_cast<int32_t>(edges_.size());
    int32_t best_cnt = -1;
    for (const auto& [tok, tgt] : buf) {
      if (st_[tgt].cnt > best_cnt) {
        best_cnt = st_[tgt].cnt;
        x.best_tok = tok;
        x.best_tgt = tgt;
      }
      edges_.push_back(Edge{tok, tgt});
    }
  }
  st_[m].edge_begin = static_cast<int32_t>(edges_.size());
  edges_.shrink_to_fit();
  // 5. Support: for each g-gram state, the distinct sequences with a position whose g-long suffix it holds.
  std::vector<int32_t> last_seq(m, -1);
  auto down = [&](int32_t v, int64_t l) {
    while (v != 0 && st_[st_[v].link].len >= l) v = st_[v].link;
    return v;
  };
  for (size_t i = 0; i < seqs.size(); ++i) {
    int32_t v = 0;
    int64_t l = 0;
    for (int64_t p = seqs.offsets[i]; p < seqs.offsets[i + 1]; ++p) {
      int32_t c = seqs.tokens[p];
      // The whole sequence is in the automaton, so its capped match is always min(gram, prefix) long. Capping at
      // gram - 1 before advancing keeps v on states whose edges survived the pruning (gram <= depth).
      if (l > gram_ - 1) {
        l = gram_ - 1;
        v = down(v, l);
      }
      int32_t nx = find(v, c);
      while (nx < 0 && v != 0) {
        v = st_[v].link;
        l = st_[v].len;
        nx = find(v, c);
      }
      if (nx < 0) { v = 0; l = 0; continue; }  // unreachable: every token of a built sequence has an edge
      v = nx;
      ++l;
      if (l == gram_ && last_seq[v] != static_cast<int32_t>(i)) {
        last_seq[v] = static_cast<int32_t>(i);
        ++st_[v].distinct;
      }
    }
  }
}

}  // namespace das
