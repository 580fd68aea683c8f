"""Length-aware speculation policy: per-round draft budgets (DAS, arXiv 2511.13841, Sec. 4.3 / 5).

Rollout lengths in RL have a long tail, and the longest requests set a step's makespan. The policy gives long
requests big draft budgets and short ones little or none, and spends more as the running batch drains (with few
requests left, a forward pass is dominated by its fixed cost ``c_base`` and extra verification tokens are nearly
free). One implementation serves the replay benchmark (``das_trl.bench.replay``) and the live vLLM proposer.

Usage (per GRPO step / engine round)::

    policy = LengthPolicy(LengthPolicyConfig())
    policy.observe(problem_key, [len(c) for c in completions])     # on each history push
    budgets = policy.budgets([(key_i, output_len_i), ...], num_running)   # once per engine round
    policy.record_acceptance(drafted=..., accepted=...)            # optional: feeds the "cost" mode

In the live vLLM proposer (``das_trl.vllm.proposer``), per ``propose`` call: ``requests`` = for each row of the
input batch with sampled tokens, ``(problem key of the request, num_tokens - num_prompt_tokens)``;
``num_running`` = ``len(input_batch.req_ids)``; the budget replaces the fixed ``num_speculative_tokens`` (still
capped by it and by ``max_model_len - num_tokens - 1``). ``observe`` goes where the proposer pushes history
(``DASDrafter.add_rollouts``: one call per problem with its completions' lengths); ``record_acceptance`` takes the
previous round's drafted / accepted counts (only ``cost`` mode reads them).

Modes:

``tiers`` (default)
    Each known problem gets a length score ``s = w * mean + (1 - w) * max`` of its recent completion lengths
    (tokens; ``w = score_mean_weight``). Problems are ranked by score: the top ``long_fraction`` are *long*, the next
    ``medium_fraction`` *medium*, the rest *short* (the paper's authors: 20% / 40% / 40%, about 16 / 8 / 0-4 draft
    tokens). A problem never seen gets the tier of the ``unseen_prior_quantile`` of the known scores (the global
    length distribution's median by default -> medium with the default fractions). At run time a request is
    *promoted* when its output length (tokens) passes a tier's threshold: the smallest score of that tier times
    ``promote_factor``. Budgets are then multiplied by the drain growth
    ``g = clip((peak_running / num_running) ** drain_exponent, 1, drain_max_growth)`` (``peak_running``: the
    largest ``num_running`` since the last ``new_step``/``observe``, or ``drain_reference_batch`` when set),
    capped at ``max_budget``, and finally scaled down proportionally so the round's total stays within
    ``step_token_cap``.

``cost``
    The paper's cost-model optimum, with its closed form (Eq. 7) corrected. Model: a forward pass costs
    ``c_base + c_tok * tokens`` (ms). A request with ``l`` tokens still to generate that is given ``p`` draft tokens
    in total accepts ``k * l * (1 - exp(-a * p / l))`` of them (``k``: the fraction of its tokens that drafting can
    cover at all, ``a``: acceptance per draft token while far from saturation, ``k * a`` the initial acceptance
    rate), so it needs ``N = l - k l (1 - exp(-a p / l))`` forward passes. To finish every request within ``N``
    passes, request ``i`` needs ``p_i(N) = -(l_i / a_i) * ln(1 - (1 - N / l_i) / k_i)`` draft tokens (0 when
    ``l_i <= N``). Minimising ``T(N) = c_base * N + c_tok * sum_i p_i(N)`` gives the optimality condition
    ``c_base = c_tok * sum_{l_i > N} 1 / (a_i * (k_i - 1 + N / l_i))``; its left side is constant and its right
    side decreases in ``N``, so ``N*`` is found by bisection on ``(max_i l_i (1 - k_i), max_i l_i]``. The per-round
    budget is ``p_i(N*) / N*`` rounded up, capped at ``max_budget`` and by ``step_token_cap``. ``l_i`` is the
    request's expected remaining length (problem score minus current length, at least ``cost_min_remaining``);
    ``k`` is ``cost_coverage``; ``a`` is the measured acceptance rate (``record_acceptance``) divided by ``k``, or
    ``cost_acceptance_prior / k`` before any measurement.

``fixed``
    Every request gets ``fixed_budget`` (still subject to ``step_token_cap``): the length-unaware baseline.

numpy and the standard library only.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Hashable, Sequence

import numpy as np

TIER_NAMES = ("short", "medium", "long")
SHORT, MEDIUM, LONG = 0, 1, 2


@dataclass
class LengthPolicyConfig:
    """Settings of :class:`LengthPolicy` (lengths in tokens, times in ms). Validated on construction.

    Attributes:
        mode: ``"tiers"`` | ``"cost"`` | ``"fixed"`` (see the module docstring).
        long_fraction / medium_fraction: share of known problems (ranked by length score) in the long / medium
            tier; the rest are short. Paper's authors: 0.2 / 0.4.
        long_budget / medium_budget / short_budget: draft tokens per round per tier before drain growth.
        score_mean_weight: ``w`` in the length score ``w * mean + (1 - w) * max``.
        history_lengths: completion lengths kept per problem (most recent first out).
        unseen_prior_quantile: quantile of known problems' scores used as an unseen problem's score.
        promote_factor: a request is promoted to a tier once its output length exceeds that tier's smallest
            score times this factor.
        drain_exponent / drain_max_growth: drain growth ``clip((peak / running) ** exponent, 1, max_growth)``.
        drain_reference_batch: fixed ``peak`` (0 = the largest ``num_running`` seen since the last step start).
        max_budget: hard cap of one request's budget per round.
        step_token_cap: cap of total draft tokens per engine round (0 = none).
        fixed_budget: budget of every request in ``"fixed"`` mode.
        c_base_ms / c_tok_ms: forward-pass cost model ``c_base + c_tok * tokens`` (paper Fig. 8: 7 ms, 0.025 ms).
        cost_coverage: ``k`` of the cost mode (fraction of a request's tokens drafting can cover).
        cost_acceptance_prior: initial acceptance rate ``k * a`` before ``record_acceptance`` data.
        cost_min_remaining: smallest expected remaining length (tokens) of a running request in ``"cost"`` mode.
    """

    mode: str = "tiers"
    long_fraction: float = 0.2
    medium_fraction: float = 0.4
    long_budget: int = 16
    medium_budget: int = 8
    short_budget: int = 2
    score_mean_weight: float = 0.5
    history_lengths: int = 64
    unseen_prior_quantile: float = 0.5
    promote_factor: float = 1.0
    drain_exponent: float = 0.5
    drain_max_growth: float = 4.0
    drain_reference_batch: int = 0
    max_budget: int = 32
    step_token_cap: int = 1024
    fixed_budget: int = 16
    c_base_ms: float = 7.0
    c_tok_ms: float = 0.025
    cost_coverage: float = 0.9
    cost_acceptance_prior: float = 0.5
    cost_min_remaining: int = 16

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"LengthPolicyConfig: {msg}")

        need(self.mode in ("tiers", "cost", "fixed"), f"mode must be tiers|cost|fixed, got {self.mode!r}")
        need(0 <= self.long_fraction <= 1 and 0 <= self.medium_fraction <= 1
             and self.long_fraction + self.medium_fraction <= 1,
             "long_fraction and medium_fraction must be in [0, 1] with sum <= 1")
        for name in ("long_budget", "medium_budget", "short_budget", "max_budget", "fixed_budget",
                     "step_token_cap", "drain_reference_batch", "cost_min_remaining"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 0, f"{name} must be an int >= 0, got {v!r}")
        need(isinstance(self.history_lengths, int) and self.history_lengths >= 1, "history_lengths must be >= 1")
        need(0 <= self.score_mean_weight <= 1, "score_mean_weight must be in [0, 1]")
        need(0 <= self.unseen_prior_quantile <= 1, "unseen_prior_quantile must be in [0, 1]")
        need(self.promote_factor > 0, "promote_factor must be > 0")
        need(self.drain_exponent >= 0 and self.drain_max_growth >= 1, "drain_exponent >= 0, drain_max_growth >= 1")
        need(self.c_base_ms > 0 and self.c_tok_ms > 0, "c_base_ms and c_tok_ms must be > 0")
        need(0 < self.cost_coverage <= 1, "cost_coverage must be in (0, 1]")
        need(0 < self.cost_acceptance_prior <= 1, "cost_acceptance_prior must be in (0, 1]")

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------- cost-model algebra
def cost_optimal_drafts(l: np.ndarray, k: np.ndarray, a: np.ndarray, N: float) -> np.ndarray:
    """Total draft tokens ``p_i(N) = -(l_i/a_i) ln(1 - (1 - N/l_i)/k_i)`` so request ``i`` (``l_i`` tokens left)
    finishes in ``N`` forward passes; 0 where ``l_i <= N``. Requires ``N > l_i (1 - k_i)``."""
    l, k, a = (np.asarray(x, dtype=np.float64) for x in (l, k, a))
    out = np.zeros_like(l)
    m = l > N
    u = 1.0 - (1.0 - N / l[m]) / k[m]
    out[m] = -(l[m] / a[m]) * np.log(u)
    return out


def cost_condition_rhs(l: np.ndarray, k: np.ndarray, a: np.ndarray, N: float, c_tok: float) -> float:
    """Right side of the optimality condition: ``c_tok * sum_{l_i > N} 1 / (a_i (k_i - 1 + N/l_i))`` (ms/pass)."""
    l, k, a = (np.asarray(x, dtype=np.float64) for x in (l, k, a))
    m = l > N
    return float(c_tok * np.sum(1.0 / (a[m] * (k[m] - 1.0 + N / l[m]))))


def cost_optimal_passes(l: np.ndarray, k: np.ndarray, a: np.ndarray, c_base: float, c_tok: float,
                        iters: int = 32) -> float:
    """``N*`` solving ``c_base = cost_condition_rhs(N)`` by bisection on ``(max l(1-k), max l]`` (forward passes).

    The right side is decreasing in N (terms drop out, with a downward jump, where ``N`` passes an ``l_i``), +inf at
    the lower end (where a request's ``k_i - 1 + N/l_i`` -> 0) and ``c_tok / (a k)`` of the longest request just
    below ``max l``. If that is >= ``c_base`` the optimum is ``max l`` (no drafting for anyone pays); otherwise
    bisection finds the crossing (a root of the condition, or the jump where ``T'(N)`` changes sign). Returns 0 for
    an empty input."""
    l = np.asarray(l, dtype=np.float64)
    if l.size == 0:
        return 0.0
    k = np.asarray(k, dtype=np.float64)
    lo = float(np.max(l * (1.0 - k)))
    hi = float(np.max(l))
    if cost_condition_rhs(l, k, a, hi * (1 - 1e-12), c_tok) >= c_base:
        return hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mid <= lo or cost_condition_rhs(l, k, a, mid, c_tok) > c_base:
            lo = mid
        else:
            hi = mid
    return hi


# ---------------------------------------------------------------------------- policy
class LengthPolicy:
    """Per-round draft budgets from each problem's historical lengths (see the module docstring).

    Not thread-safe by itself; the caller (proposer / replay) serialises calls.
    """

    def __init__(self, config: LengthPolicyConfig | None = None) -> None:
        self.config = config if config is not None else LengthPolicyConfig()
        self._lengths: dict[Hashable, deque] = {}
        self._scores: dict[Hashable, float] = {}
        self._tier_of: dict[Hashable, int] = {}
        self._dirty = False
        self._thr_medium = math.inf  # smallest score of the medium tier (tokens)
        self._thr_long = math.inf    # smallest score of the long tier (tokens)
        self._prior_score = math.nan
        self._prior_tier = MEDIUM
        self._peak_running = 0
        self._drafted = 0
        self._accepted = 0

    # ------------------------------------------------------------------ history
    def observe(self, problem_key: Hashable, completion_lengths: Sequence[int]) -> None:
        """Record completion lengths (tokens) of one appearance of a problem (call on every history push).

        Also starts a new step for the drain growth (``peak_running`` is reset)."""
        lens = [int(x) for x in completion_lengths if int(x) > 0]
        if not lens:
            return
        dq = self._lengths.get(problem_key)
        if dq is None:
            dq = self._lengths[problem_key] = deque(maxlen=self.config.history_lengths)
        dq.extend(lens)
        w = self.config.score_mean_weight
        arr = np.fromiter(dq, dtype=np.float64)
        self._scores[problem_key] = w * float(arr.mean()) + (1 - w) * float(arr.max())
        self._dirty = True
        self._peak_running = 0

    def new_step(self) -> None:
        """Start a new generation step: the drain growth's reference batch is re-measured."""
        self._peak_running = 0

    def record_acceptance(self, drafted: int, accepted: int) -> None:
        """Feed verified draft counts (tokens) into the acceptance estimate used by ``"cost"`` mode."""
        self._drafted += int(drafted)
        self._accepted += int(accepted)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens so far (``cost_acceptance_prior`` before any data)."""
        if self._drafted <= 0:
            return self.config.cost_acceptance_prior
        return max(1e-3, min(1.0, self._accepted / self._drafted))

    def _refresh(self) -> None:
        if not self._dirty:
            return
        cfg = self.config
        keys = list(self._scores)
        scores = np.array([self._scores[k] for k in keys])
        n = len(keys)
        order = np.argsort(-scores, kind="stable")  # longest first
        n_long = int(round(cfg.long_fraction * n))
        n_med = int(round(cfg.medium_fraction * n))
        tiers = np.full(n, SHORT, dtype=np.int64)
        tiers[order[:n_long]] = LONG
        tiers[order[n_long:n_long + n_med]] = MEDIUM
        self._tier_of = {k: int(t) for k, t in zip(keys, tiers)}
        self._thr_long = float(scores[order[n_long - 1]]) if n_long > 0 else math.inf
        self._thr_medium = float(scores[order[n_long + n_med - 1]]) if n_long + n_med > 0 else math.inf
        self._prior_score = float(np.quantile(scores, cfg.unseen_prior_quantile))
        self._prior_tier = self._tier_for_score(self._prior_score)
        self._dirty = False

    def _tier_for_score(self, s: float) -> int:
        if s >= self._thr_long:
            return LONG
        if s >= self._thr_medium:
            return MEDIUM
        return SHORT

    def tier(self, problem_key: Hashable, current_output_len: int = 0) -> int:
        """Tier (0 short, 1 medium, 2 long) of a request: its problem's tier (the prior for an unseen problem;
        medium when nothing is known), promoted by its running output length (tokens)."""
        self._refresh()
        t = self._tier_of.get(problem_key)
        if t is None:
            t = self._prior_tier if self._scores else MEDIUM
        f = self.config.promote_factor
        if current_output_len > self._thr_long * f:
            return LONG
        if t < MEDIUM and current_output_len > self._thr_medium * f:
            return MEDIUM
        return t

    def expected_length(self, problem_key: Hashable) -> float:
        """Length score (tokens) of a problem, or the unseen prior (nan when nothing is known)."""
        self._refresh()
        return self._scores.get(problem_key, self._prior_score)

    def drain_growth(self, num_running: int) -> float:
        """Budget multiplier for a running batch of ``num_running`` requests (>= 1)."""
        cfg = self.config
        num_running = max(1, int(num_running))
        self._peak_running = max(self._peak_running, num_running)
        ref = cfg.drain_reference_batch or self._peak_running
        return float(min(cfg.drain_max_growth, max(1.0, (ref / num_running) ** cfg.drain_exponent)))

    # ------------------------------------------------------------------ budgets
    def budgets(self, requests: Sequence[tuple[Hashable, int]], num_running: int | None = None) -> list[int]:
        """Draft budget (tokens) per request for one engine round.

        Args:
            requests: ``(problem_key, current_output_len)`` per running request (output length in tokens).
            num_running: requests running in the engine (default ``len(requests)``).

        Returns:
            One int >= 0 per request; each <= ``max_budget``; their sum <= ``step_token_cap`` (if > 0).
        """
        cfg = self.config
        if num_running is None:
            num_running = len(requests)
        if not requests:
            return []
        if cfg.mode == "fixed":
            out = [min(cfg.fixed_budget, cfg.max_budget)] * len(requests)
        elif cfg.mode == "cost":
            out = self._cost_budgets(requests)
        else:
            g = self.drain_growth(num_running)
            base = (cfg.short_budget, cfg.medium_budget, cfg.long_budget)
            out = [min(cfg.max_budget, int(round(base[self.tier(k, n)] * g))) for k, n in requests]
        return self._apply_cap(out)

    def _cost_budgets(self, requests: Sequence[tuple[Hashable, int]]) -> list[int]:
        cfg = self.config
        self._refresh()
        exp = np.array([self.expected_length(k) for k, _ in requests], dtype=np.float64)
        cur = np.array([n for _, n in requests], dtype=np.float64)
        exp = np.where(np.isnan(exp), cur + 4.0 * cfg.cost_min_remaining, exp)
        l = np.maximum(exp - cur, float(cfg.cost_min_remaining))
        k = np.full_like(l, cfg.cost_coverage)
        a = np.full_like(l, self.acceptance_rate / cfg.cost_coverage)
        N = cost_optimal_passes(l, k, a, cfg.c_base_ms, cfg.c_tok_ms)
        if N <= 0:
            return [0] * len(requests)
        per_round = cost_optimal_drafts(l, k, a, N) / N
        return [int(min(cfg.max_budget, math.ceil(x - 1e-9))) for x in per_round]

    def _apply_cap(self, out: list[int]) -> list[int]:
        cap = self.config.step_token_cap
        total = sum(out)
        if cap <= 0 or total <= cap:
            return out
        scale = cap / total
        return [int(math.floor(b * scale)) for b in out]

    def stats(self) -> dict:
        """Known problems, tier sizes and thresholds (tokens), acceptance estimate."""
        self._refresh()
        counts = [0, 0, 0]
        for t in self._tier_of.values():
            counts[t] += 1
        return {"problems": len(self._scores), "tiers": dict(zip(TIER_NAMES, counts)),
                "threshold_medium": self._thr_medium, "threshold_long": self._thr_long,
                "prior_score": self._prior_score, "prior_tier": TIER_NAMES[self._prior_tier],
                "acceptance_rate": self.acceptance_rate}
