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
};

// Shapes: accept [n, k], table [n, w] (each row's lengths ascending, padding below any length first), pooled [m]
// ascending, generated / cap / tau_obs [n] (cap: most tokens still allowed, +inf for none), draws [4, n, s] uniforms
// in [0, 1) (index, mixture, tail, jitter). Outputs [n]: lengths (kept draft tokens), value (ms per token of progress
// at that length), p (probability of finishing last, shrunk), expected_kept (sum of accept * survival over the kept
// positions), rem_mean (mean sampled remaining tokens). Returns the expected makespan in rounds.
double controller_budgets(int64_t n, int64_t k, const double* accept, int64_t w, const double* table, int64_t m,
                          const double* pooled, const double* generated, const double* cap, const double* tau_obs,
                          int64_t s, const double* draws, const ControllerParams& prm, int32_t* lengths,
                          double* value, double* p, double* expected_kept, double* rem_mean);

// The cut of a planned step (das_trl/budget/controller.py, BudgetController.cut): for the m drafted rows only, with
// each row's weight (c_base * P_i, from the plan over the whole batch) given instead of computed. Same shapes as
// controller_budgets for the m rows (draws [4, m, s]); outputs lengths, value and expected_kept [m].
void controller_cut(int64_t m_rows, int64_t k, const double* accept, int64_t w, const double* table, int64_t m,
                    const double* pooled, const double* generated, const double* cap, int64_t s, const double* draws,
                    const double* weight, const ControllerParams& prm, int32_t* lengths, double* value,
                    double* expected_kept);

}  // namespace das
