// See controller.h. Each block names the function of das_trl/budget/controller.py it mirrors.
#include "controller.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "speculate.h"

namespace das {

namespace {

std::atomic<int64_t> g_scratch_bytes{0};

// The kernels' per-row arrays ([n, s] samples, [n, bins] histograms: ~0.3 MB at 256 rows, ~1.2 MB at 1,024), kept
// per calling thread between calls. Allocated and freed per call they sat at the top of glibc's heap, which it gave
// back to the system after each call and faulted in again at the next: page faults were ~45 % of a recomputation's
// time at 256 rows. Bounded by the largest batch a thread planned; controller_scratch_bytes() reports them all.
struct Scratch {
  std::vector<double> rem, x, tau, tau_s, gen, cap;
  std::vector<int32_t> b, midv;
  int64_t bytes = 0;
  ~Scratch() { g_scratch_bytes.fetch_sub(bytes, std::memory_order_relaxed); }
  // v resized to at least n elements (contents unspecified: every caller writes what it reads).
  template <class T>
  T* take(std::vector<T>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) {
      const int64_t before = static_cast<int64_t>(v.capacity() * sizeof(T));
      v.resize(static_cast<size_t>(n));
      const int64_t grown = static_cast<int64_t>(v.capacity() * sizeof(T)) - before;
      bytes += grown;
      g_scratch_bytes.fetch_add(grown, std::memory_order_relaxed);
    }
    return v.data();
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// remaining_samples: per row, s remaining lengths conditional on exceeding the tokens generated so far.
void sample_remaining(int64_t n, int64_t w, const double* table, int64_t m, const double* pooled,
                      const double* generated, const double* cap, int64_t s, const double* draws, int64_t draw_rows,
                      const ControllerParams& prm, double* rem, double* rem_mean) {
  // draws [4, draw_rows, s]: draw_rows == 1 gives every row the same draws (the stratified ones), no [4, n, s] copy.
  const int64_t rs = draw_rows == 1 ? 0 : s;
  const double* du = draws;
  const double* dv = draws + draw_rows * s;
  const double* de = draws + 2 * draw_rows * s;
  const double* dj = draws + 3 * draw_rows * s;
  const double jit = prm.jitter * std::sqrt(3.0);
  // The jitter factors exp(jit (2 u - 1)) of a row, recomputed only when its draws differ from the previous row's
  // (stratified draws are the same for every row: one exp per sample instead of one per row and sample).
  // The same for the exponential tail's log1p(-e).
  const size_t row_bytes = sizeof(double) * static_cast<size_t>(s);
  std::vector<double> jf(static_cast<size_t>(s)), tail(static_cast<size_t>(s));
  const double* jf_of = nullptr;
  const double* tail_of = nullptr;
  for (int64_t i = 0; i < n; ++i) {
    if (prm.jitter > 0) {
      const double* dji = dj + i * rs;
      if (!jf_of || std::memcmp(jf_of, dji, row_bytes) != 0) {
        for (int64_t t = 0; t < s; ++t) jf[t] = std::exp(jit * (2.0 * dji[t] - 1.0));
        jf_of = dji;
      }
    }
    const double* dei = de + i * rs;
    if (!tail_of || std::memcmp(tail_of, dei, row_bytes) != 0) {
      for (int64_t t = 0; t < s; ++t) tail[t] = std::log1p(-dei[t]);
      tail_of = dei;
    }
    const double g = generated[i];
    const double* row = table + i * w;
    // Both are sorted ascending: the lengths above g are a suffix.
    const int64_t above = row + w - std::upper_bound(row, row + w, g);
    const int64_t above_pool = pooled + m - std::upper_bound(pooled, pooled + m, g);
    const double scale = std::max(prm.min_remaining, prm.extrapolation_fraction * g);
    const double p_pool =
        above_pool > 0 ? prm.pooled_weight / std::max(static_cast<double>(above) + prm.pooled_weight, 1e-12) : 0.0;
    const double cap_i = std::max(cap[i], 1.0);
    double sum = 0.0;
    for (int64_t t = 0; t < s; ++t) {
      const int64_t at = i * s + t, dat = i * rs + t;
      const double u = du[dat];
      int64_t oi = w - above + static_cast<int64_t>(u * static_cast<double>(above));
      const double own = row[std::clamp<int64_t>(oi, 0, w - 1)];
      double pool = 0.0;
      if (m) {
        int64_t pi = m - above_pool + static_cast<int64_t>(u * static_cast<double>(above_pool));
        pool = pooled[std::clamp<int64_t>(pi, 0, m - 1)];
      }
      const bool use_pool = (dv[dat] < p_pool) || (above == 0 && above_pool > 0);
      double total = use_pool ? pool : (above > 0 ? own : g);
      if (!(total > g)) total = g - scale * tail[t];  // exponential tail past every observed length
      double r = total - g;
      if (prm.jitter > 0) r *= jf[t];
      r = std::min(std::max(r, 1.0), cap_i);
      rem[at] = r;
      sum += r;
    }
    if (rem_mean) rem_mean[i] = sum / static_cast<double>(s);
  }
}

// survival + optimal_draft_lengths for row i: position j pays while the cost per token of progress keeps falling.
void cut_row(int64_t i, int64_t k, int64_t s, const double* accept, const double* rem, double weight,
             const ControllerParams& prm, std::vector<int32_t>& hist, int32_t* lengths, double* value,
             double* expected_kept) {
  std::fill(hist.begin(), hist.end(), 0);
  for (int64_t t = 0; t < s; ++t) {
    const double f = std::floor(rem[i * s + t]);
    hist[static_cast<size_t>(std::min<double>(f, static_cast<double>(k + 1)))] += 1;
  }
  double tau = 1.0, best = (weight + prm.c_tok_ms) / tau;  // d = 0
  int32_t best_d = 0;
  double kept = 0.0, kept_best = 0.0;
  int64_t below = hist[0];
  // Past a row's last nonzero estimate (its draft's end: DraftBatch.accept is 0 there) tau stops growing while the
  // cost keeps growing, so no later length can win (the compared ratio only rises): the walk stops there, with the
  // same result as walking all k positions. Needs a cost that does not fall with d (c_tok, 1 + margin >= 0).
  int64_t end = k;
  if (prm.c_tok_ms >= 0.0 && prm.draft_margin >= -1.0 && weight >= 0.0)
    while (end > 0 && accept[i * k + end - 1] == 0.0) --end;
  for (int64_t j = 0; j < end; ++j) {
    below += hist[j + 1];
    const double surv = 1.0 - static_cast<double>(below) / static_cast<double>(s);
    const double a = accept[i * k + j];
    tau += std::min(a * surv * prm.ratio, 1.0);
    kept += a * surv;
    const double d = static_cast<double>(j + 1);
    const double ratio = (weight + prm.c_tok_ms * (1.0 + (1.0 + prm.draft_margin) * d)) / tau;
    if (ratio * (1.0 + 1e-9 * d) < best * (1.0 + 1e-9 * best_d)) {
      best = ratio;
      best_d = static_cast<int32_t>(j + 1);
      kept_best = kept;
    }
  }
  lengths[i] = best_d;
  value[i] = best;
  expected_kept[i] = kept_best;
}

// tail_probability: p [n] (normalised, before the prior shrink) from sampled remaining lengths rem [n, s] divided by
// tau_obs [n] (rounds): per-row histograms over `bins` log-spaced bins. Returns the expected makespan in rounds.
// tau: [n] one tokens-per-round per row, or (per_sample) [n, s] one per sample.
double tail_from_samples(int64_t n, int64_t s, const double* rem, const double* tau, bool per_sample, int bins,
                         double* p) {
  // Each sample's bin is floor(x bins / top), x = log1p(rounds), top = the largest x. log(1 + rounds) is within
  // log_err(x) of log1p(rounds) (both within 2 ulp of the true value; 1 + rounds rounds by half an ulp) and a third of
  // its cost: it stands in for log1p wherever the bin cannot change by that much, and log1p is taken where it could
  // and for the samples that may hold the maximum, so the bins and top are exactly log1p's.
  const auto log_err = [](double x) { return 1e-13 * (1.0 + x); };
  const auto rounds_at = [&](int64_t i, int64_t t) {
    return rem[i * s + t] / (per_sample ? tau[i * s + t] : tau[i]);
  };
  double makespan = 0.0;
  Scratch& sc = scratch();
  double* x = sc.take(sc.x, n * s);
  double top_near = 0.0;
  for (int64_t t = 0; t < s; ++t) {
    double mx = -1.0;
    for (int64_t i = 0; i < n; ++i) {
      const double rounds = rounds_at(i, t);
      mx = std::max(mx, rounds);
      const double xv = std::log(1.0 + std::max(rounds, 0.0));
      x[i * s + t] = xv;
      top_near = std::max(top_near, xv);
    }
    makespan += mx;
  }
  makespan /= static_cast<double>(s);
  if (n == 1) {
    p[0] = 1.0;
  } else {
    double top = 0.0;  // exactly max log1p: the largest lies within 2 log_err of the largest stand-in
    const double near = top_near - 2.0 * log_err(top_near);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = 0; t < s; ++t)
        if (x[i * s + t] >= near) top = std::max(top, std::log1p(std::max(rounds_at(i, t), 0.0)));
    int32_t* b = sc.take(sc.b, n * s);
    int32_t* midv = sc.take(sc.midv, n * bins);  // mid * 2 s; log(mid) is logtab[midv]
    std::vector<double> total(bins, 0.0);
    std::vector<int32_t> zeros(bins, 0);
    const double scale = top > 0 ? bins / top : 0.0;
    // mid_j(g) = P(R_j < g) + pmf_j(g) / 2 = (2 below + count) / (2 s) with integer counts: its logarithm comes from
    // a table of 2 s + 1 values (one log per row and bin was most of this kernel's time at large batches).
    std::vector<double> logtab(static_cast<size_t>(2 * s + 1), 0.0);
    for (int64_t v = 1; v <= 2 * s; ++v) logtab[v] = std::log(static_cast<double>(v) / (2.0 * static_cast<double>(s)));
    std::vector<int32_t> cnt(bins);
    for (int64_t i = 0; i < n; ++i) {
      std::fill(cnt.begin(), cnt.end(), 0);
      for (int64_t t = 0; t < s; ++t) {
        int32_t bi = 0;
        if (top > 0) {
          const double v = x[i * s + t] * scale, margin = 2.0 * log_err(x[i * s + t]) * scale + 1e-12;
          const int64_t lo = std::min<int64_t>(static_cast<int64_t>(std::max(v - margin, 0.0)), bins - 1);
          const int64_t hi = std::min<int64_t>(static_cast<int64_t>(v + margin), bins - 1);
          bi = static_cast<int32_t>(
              lo == hi ? lo
                       : std::min<int64_t>(static_cast<int64_t>(std::log1p(std::max(rounds_at(i, t), 0.0)) * scale),
                                           bins - 1));
        }
        b[i * s + t] = bi;
        cnt[bi] += 1;
      }
      int64_t below = 0;
      for (int g = 0; g < bins; ++g) {
        const int64_t v = 2 * below + cnt[g];
        below += cnt[g];
        midv[i * bins + g] = static_cast<int32_t>(v);
        total[g] += logtab[v];  // log 1 = 0 where mid is 0 (counted in zeros)
        zeros[g] += v == 0;
      }
    }
    // P_i = mean over row i's samples of prod_{j != i} mid_j(bin): one exp per distinct bin of the row.
    // exp(total[g] - log mid_i(g)) = prod_all(g) / mid_i(g): one exp per bin, unless the product is too small for a
    // double (then one exp per row and bin, as before).
    std::vector<double> prod(bins);
    std::vector<char> exact(bins);
    for (int g = 0; g < bins; ++g) {
      exact[g] = total[g] > -600.0;
      prod[g] = exact[g] ? std::exp(total[g]) : 0.0;
    }
    double tot = 0.0;
    std::vector<int32_t> count(bins);
    for (int64_t i = 0; i < n; ++i) {
      std::fill(count.begin(), count.end(), 0);
      for (int64_t t = 0; t < s; ++t) count[b[i * s + t]] += 1;
      double acc = 0.0;
      for (int g = 0; g < bins; ++g) {
        if (!count[g] || zeros[g] != 0) continue;
        acc += count[g] * (exact[g] ? prod[g] * (2.0 * static_cast<double>(s)) / midv[i * bins + g]
                                    : std::exp(total[g] - logtab[midv[i * bins + g]]));
      }
      p[i] = acc / static_cast<double>(s);
      tot += p[i];
    }
    for (int64_t i = 0; i < n; ++i) p[i] = tot > 0 ? p[i] / tot : 1.0 / static_cast<double>(n);
  }
  return makespan;
}

}  // namespace

double controller_budgets(int64_t n, int64_t k, const double* accept, int64_t w, const double* table, int64_t m,
                          const double* pooled, const double* generated, const double* cap, const double* tau_obs,
                          int64_t s, const double* draws, int64_t draw_rows, const ControllerParams& prm,
                          int32_t* lengths, double* value, double* p, double* expected_kept, double* rem_mean) {
  if (n <= 0) return 0.0;
  Scratch& sc = scratch();
  double* rem = sc.take(sc.rem, n * s);
  sample_remaining(n, w, table, m, pooled, generated, cap, s, draws, draw_rows, prm, rem, rem_mean);
  const double makespan = tail_from_samples(n, s, rem, tau_obs, false, prm.bins, p);
  const double tw = prm.tail_prior_weight;
  for (int64_t i = 0; i < n; ++i) p[i] = (1.0 - tw) * p[i] + tw / static_cast<double>(n);
  std::vector<int32_t> hist(static_cast<size_t>(k + 2));
  for (int64_t i = 0; i < n; ++i)
    cut_row(i, k, s, accept, rem, prm.c_base_ms * p[i], prm, hist, lengths, value, expected_kept);
  return makespan;
}

CutResult controller_cut(int64_t m_rows, int64_t k, const double* accept, int64_t w, const double* table, int64_t m,
                         const double* pooled, const int64_t* rows, const double* generated, const double* cap,
                         int64_t s, const double* draws, int64_t draw_rows, const double* weight,
                         const ControllerParams& prm, int32_t* lengths, double* value, double* expected_kept) {
  CutResult res{0, 0, 0, 0.0};
  if (m_rows <= 0) return res;
  // Checked before anything is computed (NaN fails too): the estimates must be DraftBatch.accept's probabilities.
  for (int64_t j = 0; j < m_rows * k; ++j)
    if (!(accept[j] >= 0.0 && accept[j] <= 1.0))
      throw InputError("BudgetController.cut: accept must lie in [0, 1], got " + std::to_string(accept[j]) +
                       " in row " + std::to_string(j / k) + "; pass DraftBatch.accept");
  Scratch& sc = scratch();
  double* gen = sc.take(sc.gen, m_rows);
  double* capv = sc.take(sc.cap, m_rows);
  for (int64_t i = 0; i < m_rows; ++i) {
    gen[i] = generated[rows[i]];
    capv[i] = cap ? cap[rows[i]] : HUGE_VAL;
  }
  double* rem = sc.take(sc.rem, m_rows * s);
  sample_remaining(m_rows, w, table, m, pooled, gen, capv, s, draws, draw_rows, prm, rem, nullptr);
  std::vector<int32_t> hist(static_cast<size_t>(k + 2));
  for (int64_t i = 0; i < m_rows; ++i) {
    cut_row(i, k, s, accept, rem, weight[rows[i]], prm, hist, lengths, value, expected_kept);
    res.kept_tokens += lengths[i];
    res.rows_drafting += lengths[i] > 0;
  }
  for (int64_t j = 0; j < m_rows * k; ++j) res.offered += accept[j] > 0.0;
  res.expected = pairwise_sum(expected_kept, m_rows);  // np.add.reduce's order, as the numpy path's counter
  return res;
}

PlanResult controller_plan(int64_t n, const double* out_len, const double* rounds, const double* max_output,
                           const int32_t* caps, const double* q, bool replan, int64_t w, const double* table,
                           int64_t m, const double* pooled, int64_t s, const double* draws, int64_t draw_rows,
                           const int64_t* slots, double* slot_p, int64_t* slot_epoch, int64_t epoch,
                           const double* tau_z, const double* send, const ControllerParams& prm, uint8_t* draft,
                           double* weight, double* p, double* rem_mean, int32_t* budget) {
  PlanResult res{std::nan(""), 0, 0};
  if (n <= 0) return res;
  if (replan) {
    // tau_obs = max(1, (out_len + 4) / (rounds + 4)): each row's observed tokens per round (plan()).
    Scratch& sc = scratch();
    double* tau = sc.take(sc.tau, n);
    double* cap = sc.take(sc.cap, n);
    for (int64_t i = 0; i < n; ++i) {
      tau[i] = rounds ? std::max((out_len[i] + kTauPseudoRounds) / (rounds[i] + kTauPseudoRounds), 1.0) : 1.0;
      cap[i] = max_output ? max_output[i] - out_len[i] : HUGE_VAL;
    }
    double* rem = sc.take(sc.rem, n * s);
    sample_remaining(n, w, table, m, pooled, out_len, cap, s, draws, draw_rows, prm, rem, rem_mean);
    if (prm.tau_uncertainty > 0.0 && tau_z) {
      // Each sample's tokens per round is uncertain too (plan(): _tau_samples): log-normal around tau_obs with the
      // spread of a mean over the rounds seen and the rounds still to come.
      double* tau_s = sc.take(sc.tau_s, n * s);
      for (int64_t i = 0; i < n; ++i) {
        const double seen = rounds ? rounds[i] : out_len[i];
        const double ahead = std::max(rem_mean[i] / tau[i], 1.0);
        const double sd = prm.tau_uncertainty * std::sqrt(std::max(tau[i] - 1.0, 0.0) + 0.25) *
                          std::sqrt(1.0 / (std::max(seen, 0.0) + kTauPseudoRounds) + 1.0 / ahead);
        for (int64_t t = 0; t < s; ++t)
          tau_s[i * s + t] = std::max(tau[i] * std::exp(sd / tau[i] * tau_z[t]), 1.0);
      }
      res.makespan = tail_from_samples(n, s, rem, tau_s, true, prm.bins, p);
    } else {
      res.makespan = tail_from_samples(n, s, rem, tau, false, prm.bins, p);
    }
    if (slots)
      for (int64_t i = 0; i < n; ++i) {
        slot_p[slots[i]] = p[i];
        slot_epoch[slots[i]] = epoch;
      }
  } else {  // each request's probability at the last computation, renormalised over the rows still running
    for (int64_t i = 0; i < n; ++i) p[i] = slot_p[slots[i]];
    const double tot = pairwise_sum(p, n);  // np.add.reduce's order: the same sum as the reference
    for (int64_t i = 0; i < n; ++i) p[i] = tot > 0 ? p[i] / tot : 1.0 / static_cast<double>(n);
  }
  // The prior shrink, the weights and gate_rows: the cheap bound first (S_d < q / (1 - q), cost smallest at d = 1),
  // then the first d <= caps[i] whose saving pays for its verification and the row's proposer CPU.
  const double tw = prm.tail_prior_weight, unit = prm.c_tok_ms * (1.0 + prm.draft_margin);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = (1.0 - tw) * p[i];
    p[i] += tw / static_cast<double>(n);
    res.tail_rows += p[i] >= 0.5;
    weight[i] = prm.c_base_ms * p[i];
    const double qi = std::min(std::max(q[i], 0.0), 0.999), value = weight[i] + prm.c_tok_ms;
    bool ok = false;
    const int32_t cap = std::min<int32_t>(caps[i], kMaxSpec);  // no draft is longer (MAX_SPEC_TOKENS)
    // The row's proposer CPU is paid whether or not the cut keeps its draft: per draft sent, it costs 1 / send.
    const double row_ms = send ? prm.draft_row_ms / std::max(send[i], kMinSend) : prm.draft_row_ms;
    if (cap > 0 && value * qi / (1.0 - qi) > unit + row_ms) {
      double sd = 0.0;
      for (int32_t d = 1; d <= cap && !ok; ++d) {
        const double term = std::pow(qi, static_cast<double>(d));
        sd += term;
        ok = value * sd > unit * static_cast<double>(d) + row_ms;
        // Once a position is worth less than its verification (value q^d < unit), the saving value S_d - unit d only
        // falls from there on: no longer draft pays. The margin (far above the sum's rounding, ~1e-11 ms) keeps the
        // stop exact: same decisions as walking every d (gate_rows). Most rows of a large batch stop within a few d
        // instead of walking up to 64 (AMC23: 10k pow calls per step).
        if (!ok && value * term < unit - (1e-6 * unit + 1e-9)) break;
      }
    }
    draft[i] = ok;
    res.drafted += ok;
    if (budget) budget[i] = ok ? draft_cap(weight[i], q[i], cap, prm) : 0;
  }
  return res;
}

int32_t draft_cap(double weight, double q, int32_t cap, const ControllerParams& prm) {
  const double qi = std::min(std::max(q, 0.0), 0.999);
  const double floor = prm.c_tok_ms * (1.0 + prm.draft_margin) / ((weight + prm.c_tok_ms) * std::max(prm.ratio, 1.0));
  if (!(floor < 1.0) || !(qi > 0.0)) return std::min(cap, kMinDraftCap);
  const double reach = 2.0 * std::log(floor) / std::log(qi);
  if (!(reach < static_cast<double>(cap))) return cap;
  return std::min(cap, std::max(kMinDraftCap, static_cast<int32_t>(std::ceil(reach))));
}

int64_t controller_scratch_bytes() { return g_scratch_bytes.load(std::memory_order_relaxed); }

bool controller_rows_seen(int64_t n, const int64_t* slots, int64_t m, const int64_t* slot_epoch, int64_t epoch) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots[i];
    if (s < 0 || s >= m || slot_epoch[s] < epoch) return false;
  }
  return true;
}

}  // namespace das
