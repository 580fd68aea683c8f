#include "request_book.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "common.h"
#include "drafter.h"

namespace das {

void RequestBook::set_prior(double prior, double prior_rounds, double send_rounds) {
  if (!(std::isfinite(send_rounds) && send_rounds >= 0.0))
    throw InputError("request book: send_rounds must be a finite number >= 0, got " + std::to_string(send_rounds));
  prior_ = prior;
  prior_rounds_ = prior_rounds;
  send_rounds_ = send_rounds;
}

void RequestBook::reset(int64_t slot, int64_t key, int64_t max_output, int32_t dslot) {
  if (slot < 0) throw InputError("request book: slot must be >= 0, got " + std::to_string(slot));
  if (slot >= size()) {
    const size_t cap = static_cast<size_t>(slot) + 1;
    key_.resize(cap, 0);
    rounds_.resize(cap, 0);
    max_output_.resize(cap, 0);
    sent_.resize(cap, 0);
    dslot_.resize(cap, 0);
    expected_.resize(cap, 0.0);
    hits_.resize(cap, 0.0);
    misses_.resize(cap, 0.0);
    speculated_.resize(cap, 0.0);
    sent_steps_.resize(cap, 0.0);
  }
  key_[slot] = key;
  rounds_[slot] = -1;  // the first step of a request is round 0
  max_output_[slot] = max_output;
  sent_[slot] = 0;
  expected_[slot] = hits_[slot] = misses_[slot] = speculated_[slot] = sent_steps_[slot] = 0.0;
  dslot_[slot] = dslot;
}

void RequestBook::check(const int64_t* slots, int64_t n) const {
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] < 0 || slots[i] >= size())
      throw InputError("request book: row " + std::to_string(i) + " has unknown slot " + std::to_string(slots[i]));
}

bool RequestBook::begin(const int64_t* slots, int64_t n, int64_t steps) {
  check(slots, n);
  if (steps < 1) throw InputError("request book: begin takes steps >= 1, got " + std::to_string(steps));
  bool any_sent = false;
  for (int64_t i = 0; i < n; ++i) {
    rounds_[slots[i]] += steps;
    any_sent |= sent_[slots[i]] != 0;
  }
  return any_sent;
}

bool RequestBook::distinct(const int64_t* slots, int64_t n) {
  if (stamp_.size() < key_.size()) stamp_.resize(key_.size(), 0);
  if (++stamp_now_ == 0) std::fill(stamp_.begin(), stamp_.end(), 0), stamp_now_ = 1;  // after 2**32 calls
  bool all = true;
  for (int64_t i = 0; i < n; ++i) {  // check()'s range test in the same pass (the stamps are scratch)
    if (slots[i] < 0 || slots[i] >= size())
      throw InputError("request book: row " + std::to_string(i) + " has unknown slot " + std::to_string(slots[i]));
    uint32_t& seen = stamp_[slots[i]];
    all &= seen != stamp_now_;
    seen = stamp_now_;
  }
  return all;
}

RequestBook::Observed RequestBook::prepare(const int64_t* slots, int64_t n, const int32_t* num_sampled,
                                           const int32_t* verified, const int32_t* num_tokens,
                                           const int32_t* num_prompt, int64_t max_model_len, int32_t k, int64_t* key,
                                           int32_t* out_len, int64_t* rounds, int64_t* max_output, int32_t* caps,
                                           double* q, double* send) {
  check(slots, n);
  Observed o;
  scratch_.clear();
  int64_t misses_total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots[i];
    const int64_t sent = sent_[s];
    if (sent == 0) continue;
    const int64_t checked = verified[i] >= 0 ? std::min<int64_t>(sent, verified[i]) : sent;
    const int64_t accepted = std::min<int64_t>(checked, static_cast<int64_t>(num_sampled[i]) - 1);
    o.verified_drafts += 1;
    o.accepted += accepted;
    o.checked += checked;
    scratch_.push_back(expected_[s] * static_cast<double>(checked) / static_cast<double>(sent));
    const bool miss = accepted < checked;
    hits_[s] = kOutcomeDecay * hits_[s] + static_cast<double>(accepted);
    misses_[s] = kOutcomeDecay * misses_[s] + (miss ? 1.0 : 0.0);
    misses_total += miss;
  }
  if (o.verified_drafts) {
    o.expected = pairwise_sum(scratch_.data(), static_cast<int64_t>(scratch_.size()));
    global_hits += static_cast<double>(o.accepted);
    global_misses += static_cast<double>(misses_total);
  }
  decay();
  // The gate's predictor (the reference's _RequestBook.acceptance): the request's fading record with prior_rounds
  // pseudo-rounds at the engine-wide rate, itself the engine's record with 2 pseudo-rounds at the prior.
  const double q0 = prior_, r0 = prior_rounds_;
  const double g_hits = global_hits + 2.0 * q0 / (1.0 - q0);
  const double qg = std::min(g_hits / (g_hits + global_misses + 2.0), 0.99);
  const double pseudo = r0 * qg / (1.0 - qg);
  // The chance a speculated draft survives the cut (the reference's _RequestBook.send_rate): the request's fading
  // record with send_rounds pseudo-steps at the engine-wide rate, itself with 2 pseudo-steps at 1.
  const double sr = send_rounds_;
  const double pg = (global_sent_steps + 2.0) / (global_speculated + 2.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots[i];
    key[i] = key_[s];
    out_len[i] = num_tokens[i] - num_prompt[i];
    rounds[i] = rounds_[s];
    max_output[i] = max_output_[s];
    caps[i] = static_cast<int32_t>(std::max<int64_t>(std::min<int64_t>(max_model_len - 1 - num_tokens[i], k), 0));
    const double hits = hits_[s] + pseudo;
    q[i] = hits / (hits + misses_[s] + r0);
    send[i] = sr > 0.0 ? (sent_steps_[s] + sr * pg) / (speculated_[s] + sr) : 1.0;
  }
  return o;
}

RequestBook::Finished RequestBook::finish(const int64_t* slots, int64_t n, const bool* planned,
                                          const int64_t* drafting, int64_t m, const int32_t* kept,
                                          const double* expected_kept, int32_t* tokens, double* accept,
                                          int32_t* lengths, int8_t* source, int32_t* match_len, int32_t k,
                                          Drafter* drafter) {
  check(slots, n);
  for (int64_t j = 0; j < m; ++j)
    if (drafting[j] < 0 || drafting[j] >= n || lengths[drafting[j]] <= 0)
      throw InputError("request book: drafting row " + std::to_string(drafting[j]) + " has no draft");
  Finished f;
  // A planned row the drafter found nothing for counts as a rejection in its record: otherwise a request that never
  // matches would never learn it, and would be planned again every step.
  int64_t empty = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!planned[i] || lengths[i] != 0) continue;
    const int64_t s = slots[i];
    misses_[s] = kOutcomeDecay * misses_[s] + 1.0;
    hits_[s] *= kOutcomeDecay;
    ++empty;
  }
  global_misses += static_cast<double>(empty);
  trim_slots_.clear();
  trim_len_.clear();
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = drafting[j];
    const int32_t keep = std::min(lengths[i], std::max(kept[j], 0));
    if (keep < lengths[i]) {
      std::fill(tokens + i * k + keep, tokens + (i + 1) * k, 0);
      std::fill(accept + i * k + keep, accept + (i + 1) * k, 0.0);
      if (keep == 0) {
        source[i] = -1;
        match_len[i] = 0;
      }
      lengths[i] = keep;
    }
    trim_slots_.push_back(dslot_[slots[i]]);
    trim_len_.push_back(keep);
    expected_[slots[i]] = expected_kept[j];
    f.drafts += keep > 0;
    f.draft_tokens += keep;
  }
  int64_t planned_rows = 0, sending = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots[i];
    sent_[s] = lengths[i];
    if (!planned[i]) continue;
    const bool sends = lengths[i] > 0;
    speculated_[s] = kOutcomeDecay * speculated_[s] + 1.0;
    sent_steps_[s] = kOutcomeDecay * sent_steps_[s] + (sends ? 1.0 : 0.0);
    ++planned_rows;
    sending += sends;
  }
  global_speculated = kGlobalDecay * global_speculated + static_cast<double>(planned_rows);
  global_sent_steps = kGlobalDecay * global_sent_steps + static_cast<double>(sending);
  if (drafter && m) drafter->trim(trim_slots_.data(), trim_len_.data(), m);
  return f;
}

std::vector<int64_t> RequestBook::ints(int which) const {
  switch (which) {
    case 0: return key_;
    case 1: return rounds_;
    case 2: return max_output_;
    case 3: return sent_;
    default: return std::vector<int64_t>(dslot_.begin(), dslot_.end());
  }
}

std::vector<double> RequestBook::doubles(int which) const {
  switch (which) {
    case 0: return expected_;
    case 1: return hits_;
    case 2: return misses_;
    case 3: return speculated_;
    default: return sent_steps_;
  }
}

int64_t RequestBook::bytes() const {
  return static_cast<int64_t>(key_.capacity() * 8 * 4 + dslot_.capacity() * 4 + expected_.capacity() * 8 * 5 +
                              scratch_.capacity() * 8 + (trim_slots_.capacity() + trim_len_.capacity()) * 4);
}

}  // namespace das
