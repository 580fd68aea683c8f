// Batch budget controller kernel: the per-step array work of das_trl/budget/controller.py (BudgetController.budgets)
// in one pass, so the controller's cost per engine step stays next to the drafter's (numpy's per-call overhead made
// it ~0.3 ms per step even for a handful of rows). The Python module stays the reference: same inputs (including the
// random draws, made by numpy's generator in Python), same arithmetic; results agree to floating-point rounding
// (std::exp/log vs numpy's), so a near-tie in the argmin may go the other way.
#pragma once

#include <cstdint>

namespace das {

struct ControllerParams {
  double ratio = 1.0;            // acceptance correction (BudgetController.acceptance_ratio)
  double tail_prior_weight = 0.25;
  double c_base_ms = 7.0;
  double c_tok_ms = 0.025;
  double draft_margin = 0.0;
  double pooled_weight = 1.0;
  double jitter = 0.1;
  double extrapolation_fraction = 0.25;
  double min_remaining = 16.0;
  int bins = 64;
  double draft_row_ms = 0.0;     // the proposer's CPU per drafted row (ControllerConfig.draft_row_us / 1000)
  double tau_uncertainty = 0.0;  // ControllerConfig.tau_uncertainty (controller_plan only; 0: tau_obs exact)
};

// Pseudo-rounds at 1 token per round in a row's observed tokens per round (controller.py _TAU_PSEUDO_ROUNDS).
constexpr double kTauPseudoRounds = 4.0;
// The least chance of sending a draft the gate divides a row's proposer CPU by (controller.py _MIN_SEND).
constexpr double kMinSend = 0.05;

struct PlanResult {
  double makespan;    // expected makespan in rounds (NaN when the tail probabilities were not recomputed)
  int64_t drafted;    // rows the gate drafts
  int64_t tail_rows;  // rows with P >= 0.5
};

// Shapes: accept [n, k], table [n, w] (each row's lengths ascending, padding below any length first), pooled [m]
// ascending, generated / cap / tau_obs [n] (cap: most tokens still allowed, +inf for none), draws [4, draw_rows, s]
// uniforms in [0, 1) (index, mixture, tail, jitter; draw_rows is n, or 1 when every row takes the same draws). Outputs [n]: lengths (kept draft tokens), value (ms per token of progress
// at that length), p (probability of finishing last, shrunk), expected_kept (sum of accept * survival over the kept
// positions), rem_mean (mean sampled remaining tokens). Returns the expected makespan in rounds.
double controller_budgets(int64_t n, int64_t k, const double* accept, int64_t w, const double* table, int64_t m,
                          const double* pooled, const double* generated, const double* cap, const double* tau_obs,
                          int64_t s, const double* draws, int64_t draw_rows, const ControllerParams& prm,
                          int32_t* lengths, double* value, double* p, double* expected_kept, double* rem_mean);

// The cut of a planned step (das_trl/budget/controller.py, BudgetController.cut) for its m_rows drafted rows: rows
// [m_rows] are their indices in the plan, whose generated / cap (null: no cap) / weight (c_base * P_i) arrays are
// given whole; accept [m_rows, k], table [m_rows, w] and draws [4, 1 or m_rows, s] as for controller_budgets. Outputs
// [m_rows]: lengths (kept draft tokens), value and expected_kept. Throws InputError (before any output is written)
// when an estimate lies outside [0, 1] or is NaN. Returns the step's counters.
struct CutResult {
  int64_t kept_tokens;    // sum of lengths
  int64_t rows_drafting;  // rows keeping >= 1 token
  int64_t offered;        // draft positions with an estimate > 0 (tokens the drafter offered)
  double expected;        // sum of expected_kept (numpy's pairwise order)
};
CutResult controller_cut(int64_t m_rows, int64_t k, const double* accept, int64_t w, const double* table, int64_t m,
                         const double* pooled, const int64_t* rows, const double* generated, const double* cap,
                         int64_t s, const double* draws, int64_t draw_rows, const double* weight,
                         const ControllerParams& prm, int32_t* lengths, double* value, double* expected_kept);

// BudgetController.plan after its replan decision (das_trl/budget/controller.py), in one pass: with `replan`, the
// tail probabilities from the rows' sampled remaining lengths (table / pooled / draws as above; rounds [n] gives
// tau_obs, null: 1 token per round; max_output [n] caps the remaining length, null: no cap), stored per request in
// slot_p / slot_epoch (at slots[i], with `epoch`; slots null: not stored); without it, each row's stored probability
// renormalised over the batch (slots required). Then the prior shrink, weight = c_base * P and gate_rows (q [n]
// predicted per-token acceptance, caps [n] hard draft caps, prm.draft_row_ms). Outputs [n]: draft (0/1), weight
// (ms), p (shrunk), rem_mean (mean sampled remaining tokens; written only with `replan`). With
// prm.tau_uncertainty > 0 and tau_z [s] (standard normal quantiles, one per sample; null: off), each sample's tokens
// per round is tau_obs * exp(sd / tau_obs * tau_z[t]), at least 1, sd = tau_uncertainty * sqrt(max(tau_obs - 1, 0) +
// 1/4) * sqrt(1 / (rounds + 4) + 1 / max(rem_mean / tau_obs, 1)) (controller.py, tau_samples). send [n] (null: 1):
// each row's chance that a speculated draft survives the cut; the gate charges it draft_row_ms / max(send, kMinSend).
// The caller checks shapes and that every slot indexes slot_p / slot_epoch.
PlanResult controller_plan(int64_t n, const double* out_len, const double* rounds, const double* max_output,
                           const int32_t* caps, const double* q, bool replan, int64_t w, const double* table,
                           int64_t m, const double* pooled, int64_t s, const double* draws, int64_t draw_rows,
                           const int64_t* slots, double* slot_p, int64_t* slot_epoch, int64_t epoch,
                           const double* tau_z, const double* send, const ControllerParams& prm, uint8_t* draft,
                           double* weight, double* p, double* rem_mean, int32_t* budget);

// The most draft tokens worth drafting for a row the gate drafts (controller.py draft_cap): positions whose estimate
// is below c_tok (1 + margin) / (ratio (weight + c_tok)) can never pay, and a draft of per-token acceptance q is
// assumed to stay above that for up to twice the positions q^j would (drafts vary around the row's average).
int32_t draft_cap(double weight, double q, int32_t cap, const ControllerParams& prm);

// Whether every row was seen by the plan of the current epoch: each slot in [0, m) with slot_epoch[slot] >= epoch
// (BudgetController.quiet_step's check, one pass: numpy's three calls cost ~5-12 us per engine step at 150-550 rows
// in an engine step, where their dispatch runs cold).
bool controller_rows_seen(int64_t n, const int64_t* slots, int64_t m, const int64_t* slot_epoch, int64_t epoch);

// Bytes of the kernels' scratch arrays, all threads together: each thread that called a kernel keeps its own, sized
// by the largest batch it planned, until it exits.
int64_t controller_scratch_bytes();

// The fewest tokens draft_cap gives a drafted row.
constexpr int32_t kMinDraftCap = 4;

}  // namespace das
