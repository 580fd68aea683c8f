// Per-request records of the engine-step speculator (das_trl/vllm/speculator.py), by slot, and the bookkeeping of one
// engine step around the budget controller's plan and cut: what the Python reference (_RequestBook in
// das_trl/vllm/request_book.py) does with ~70 numpy calls, in three calls of O(rows) scalar work, so a step in
// which little or nothing drafts does not pay Python's per-call cost on the engine's critical path.
//
// Results equal the reference's bit for bit (tests/test_request_book.py): the same double operations in the same
// order (no FMA contraction: the core is built without -march / -ffast-math), and the one float sum (expected
// accepted tokens of the verified drafts) in numpy's pairwise order.
// Not thread-safe (the Speculator serialises calls).
#pragma once

#include <cstdint>
#include <vector>

namespace das {

class Drafter;

class RequestBook {
 public:
  // Per-token outcomes of a request fade by kOutcomeDecay at each of its verified drafts; the engine-wide ones by
  // kGlobalDecay per step (the Speculator's _OUTCOME_DECAY / _GLOBAL_DECAY).
  static constexpr double kOutcomeDecay = 0.8;
  static constexpr double kGlobalDecay = 0.99;

  // prior: the gate's acceptance prior in [0, 1); prior_rounds: its weight in pseudo-rounds; send_rounds: the weight
  // of the engine-wide send rate in a request's chance of sending a draft when speculated (0: always 1).
  void set_prior(double prior, double prior_rounds, double send_rounds = 0.0);
  // A new request in `slot` (grows the book): problem key, max output tokens, its slot in the drafter.
  void reset(int64_t slot, int64_t key, int64_t max_output, int32_t dslot);
  // Every row's round count + `steps` (the Speculator's quiet steps recorded at once: each is one round); returns
  // whether any row had a draft sent last step.
  bool begin(const int64_t* slots, int64_t n, int64_t steps = 1);
  // Whether the n slots are pairwise distinct (a request listed twice in a step): one pass over a stamp per slot.
  bool distinct(const int64_t* slots, int64_t n);
  // `steps` steps that skipped the plan: only the engine-wide outcomes fade, once per step (the same products as
  // one call per step).
  void decay(int64_t steps = 1) {
    for (int64_t i = 0; i < steps; ++i) global_hits *= kGlobalDecay, global_misses *= kGlobalDecay;
  }

  struct Observed {
    int64_t verified_drafts = 0, accepted = 0, checked = 0;
    double expected = 0.0;  // the controller's estimate of the verified tokens' acceptance (observe_acceptance)
  };
  // Last step's verification (rows with a draft sent), then the plan's inputs per row: problem key, output length,
  // rounds, max output, hard cap min(K, max_model_len - 1 - num_tokens) >= 0, predicted per-token acceptance, and the
  // chance that a speculated draft of the row survives the cut (send).
  Observed prepare(const int64_t* slots, int64_t n, const int32_t* num_sampled, const int32_t* verified,
                   const int32_t* num_tokens, const int32_t* num_prompt, int64_t max_model_len, int32_t k,
                   int64_t* key, int32_t* out_len, int64_t* rounds, int64_t* max_output, int32_t* caps, double* q,
                   double* send);

  struct Finished {
    int64_t drafts = 0, draft_tokens = 0;
  };
  // After the drafter's step and the controller's cut: planned rows that got no draft count as a rejection; the m
  // drafting rows (row indices `drafting`) are cut to `kept` in the step's output arrays (width k) in place and in
  // the drafter (trim); what was sent and its expected acceptance are recorded for the next step, and whether each
  // planned row sent anything (its fading send record and the engine's).
  Finished finish(const int64_t* slots, int64_t n, const bool* planned, const int64_t* drafting, int64_t m,
                  const int32_t* kept, const double* expected_kept, int32_t* tokens, double* accept, int32_t* lengths,
                  int8_t* source, int32_t* match_len, int32_t k, Drafter* drafter);

  // Copies of the per-slot records (tests): key, rounds, max_output, sent, dslot / expected, hits, misses, speculated,
  // sent_steps.
  std::vector<int64_t> ints(int which) const;
  std::vector<double> doubles(int which) const;
  int64_t bytes() const;
  int64_t size() const { return static_cast<int64_t>(key_.size()); }

  double global_hits = 0.0, global_misses = 0.0;
  double global_speculated = 0.0, global_sent_steps = 0.0;  // planned rows / those that sent, fading per step

 private:
  void check(const int64_t* slots, int64_t n) const;
  double prior_ = 0.5, prior_rounds_ = 2.0, send_rounds_ = 0.0;
  std::vector<int64_t> key_, rounds_, max_output_, sent_;
  std::vector<int32_t> dslot_;
  std::vector<double> expected_, hits_, misses_, speculated_, sent_steps_;
  std::vector<double> scratch_;
  std::vector<int32_t> trim_slots_, trim_len_;
  std::vector<uint32_t> stamp_;  // distinct(): the call that last saw each slot
  uint32_t stamp_now_ = 0;
};

}  // namespace das
