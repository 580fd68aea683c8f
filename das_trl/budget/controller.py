"""The batch budget controller: how many of each request's draft tokens are worth verifying this engine step.

Once per engine step the drafter drafts every running request up to its hard cap (``DASDrafter.propose_batch``,
which also estimates ``accept[i, j]``: the probability that the first ``j + 1`` draft tokens of row ``i`` are all
accepted). The controller then keeps, per row, the number of tokens that lowers the expected time of the whole
rollout batch, and the drafts are cut to it (``DraftBatch.truncate``). Arrays in, one ``int32`` budget array out.

The model (all times in ms, lengths in tokens)
---------------------------------------------
A forward pass of ``T`` tokens costs ``c_base + c_tok * T`` (``cost_model.py``). A batch that runs ``R`` engine
steps and verifies ``V`` tokens in all therefore takes ``c_base * R + c_tok * V``: ``R`` is set by the request that
finishes last, and every verified token (accepted or not) costs ``c_tok``. Drafting never lowers ``V`` (a round
verifies ``1 + d`` tokens and emits at most that many); it only shortens ``R``. Hence:

- **Value of progress.** Request ``i`` drafting ``d`` tokens per round at acceptance profile ``a`` (``a[j]`` =
  ``accept[i, j]``) emits ``tau(d) = 1 + a[0] + ... + a[d - 1]`` tokens per round and costs
  ``c_tok * (1 + d)`` per round for its own verification plus ``c_base`` per round in the scenarios where it is the
  request that finishes last, which happens with probability ``P_i``. Its cost per token of progress is therefore

      r_i(d) = (c_base * P_i + c_tok * (1 + d)) / tau_i(d)

  and the controller picks ``d_i = argmin_d r_i(d)`` over ``0 .. K`` (:func:`optimal_draft_lengths`). The
  optimum is where the next position's expected gain stops paying for itself: position ``j`` is kept iff
  ``a[j] * V_i > c_tok`` with ``V_i = r_i(d_i)`` the value of one token of progress (``tau`` is concave in ``d``
  because ``a`` is non-increasing, so the ratio has one minimum and the first-order rule and the argmin agree).
  With ``P_i = 0`` no draft ever pays (``tau(d) <= 1 + d``); the request that will set the makespan drafts every
  position with ``a[j] > c_tok * tau / (c_base + ...)``, i.e. almost all of them.
- **Who finishes last.** ``P_i`` comes from a small vectorised Monte Carlo (:func:`remaining_samples`,
  :func:`tail_probability`): for every row, ``num_samples`` remaining lengths are drawn from its problem's windowed
  history lengths conditional on exceeding the tokens generated so far (mixed with the pooled lengths of all
  problems with weight ``pooled_weight`` pseudo-samples; problems without history use the pooled lengths only;
  past every observed length, an exponential tail of mean ``extrapolation_fraction * generated`` tokens, at least
  ``min_remaining``), jittered by a log-uniform factor of standard deviation ``length_jitter`` and capped at the
  request's ``max_output``. Dividing by the row's tokens per round (the observed one, drawn per sample around it
  with its standard error: :func:`tau_samples`) gives rounds to finish, and ``P_i`` is
  the probability that row ``i`` needs the most, computed from the per-row sample histograms (exact products of
  the other rows' distribution functions, not a count of sample maxima, so a 1 % chance is not rounded to 0; rows
  with the same samples tie and share). The estimate is shrunk towards "anyone could be last":
  ``P_i <- (1 - w) P_i + w / n`` with ``w = tail_prior_weight``, because a window of a few samples of a drifting
  policy cannot rule a request out (replays: with ``w = 0`` the tail grew by up to 25 %).
- **What the estimates are worth.** ``a`` is multiplied by the probability that position ``j`` lies before the
  request's end (:func:`survival`, from the same samples), and by the controller's own record of how its kept
  drafts fared (:attr:`BudgetController.acceptance_ratio`, bounded and fading): it keeps the tokens with the
  highest estimates, so the drafter's calibration is optimistic about exactly those.
- **Caps.** Row ``i`` never keeps more than the drafter produced (its hard cap: ``num_speculative_tokens`` and the
  model length, applied before drafting). ``step_token_cap > 0`` caps the step's total kept draft tokens: the
  tokens with the smallest marginal gain ``a[j] * V_i - c_tok`` are dropped first (:func:`apply_step_cap`).
  ``draft_margin > 0`` charges each draft token ``(1 + draft_margin) * c_tok`` in the decision (off by default).

Adapting. Large batches with uncertain tails spread ``P`` thin and keep only high-acceptance tokens; as the batch
drains, ``P`` concentrates on the remaining long requests, which draft nearly everything; a higher ``c_tok`` or a
lower acceptance shortens every draft. The cost model comes from :class:`ControllerConfig` or, with
``cost_source="online"``, from the engine's own step timings once that fit is trustworthy
(:class:`~das_trl.budget.cost_model.OnlineCostFit`).

Limits (measured by replay, docs/benchmarks.md). The rule is myopic: ``P`` is computed under the rows' past speed
(with its uncertainty), not under the plan; when several dozen requests are cut at the same ``max_tokens`` the batch
ends with the least-accepted of them, so drafts for the others and for requests that end early buy nothing, and
there the controller can spend slightly more than it saves (up to ~1 % of the batch time on the frozen T = 0.6 set
at expensive verification). A planned alternative (balancing all rows to a common makespan with this round's acceptance
profile) was worse on every set: a row without a draft this round looked unable to speed up at all.

Shapes and dtypes of :meth:`BudgetController.budgets`: ``accept float64 [n, K]``, ``problem_keys int64 [n]``,
``output_len int [n]`` (tokens generated so far), optional ``num_rounds int [n]`` (verification rounds so far),
``max_output int [n]`` (the request's ``max_tokens``); returns ``int32 [n]``.
Cost (``das-trl bench controller-speed``): with the native kernel (``ControllerConfig.backend``, default ``auto``;
``das_trl/drafter/native/src/controller.cc``) about 0.05 / 0.6 ms per call at 4 / 256 rows; the numpy
reference 0.3 / 1.6 ms.

numpy and the standard library only.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from statistics import NormalDist

import numpy as np

from .cost_model import CostModel, OnlineCostFit
from .length_table import LengthTable

_COST_SOURCES = ("config", "online")
_BACKENDS = ("auto", "native", "python")
_UNSET = object()  # a native kernel not resolved yet
_NORMAL = NormalDist()
#: The least chance of sending a draft the gate divides a row's proposer CPU by (the native kMinSend).
_MIN_SEND = 0.05
#: Request slots of :meth:`BudgetController.plan` lie below this (the per-slot tables: 16 bytes a slot, at most 64 MiB).
MAX_SLOTS = 1 << 22
#: No draft is longer (the native core's MAX_SPEC_TOKENS): larger hard caps count as this in the gate.
MAX_CAP = 64
#: Pseudo-rounds at 1 token per round in a row's observed tokens-per-round estimate.
_TAU_PSEUDO_ROUNDS = 4.0


@dataclass
class ControllerConfig:
    """Settings of :class:`BudgetController` (times in ms, lengths in tokens). Validated on construction.

    Attributes:
        c_base_ms / c_tok_ms: the cost model ``c_base + c_tok * tokens`` per forward pass (paper Fig. 8: 7 / 0.025 on
            its GPUs; ``das-trl bench cost-profile`` measures it on the current device).
        cost_source: ``"config"`` (always the two values above) or ``"online"`` (the engine's step timings once
            :class:`~das_trl.budget.cost_model.OnlineCostFit` trusts its fit; the config values until then).
        tail_prior_weight: ``w`` in ``P <- (1 - w) P + w / n`` (0: trust the Monte Carlo fully; 1: every request is
            equally likely to finish last).
        draft_margin: each draft token is charged ``(1 + draft_margin) * c_tok`` in the decision (0: the cost model
            as it is; > 0 drafts only where the gain clears the cost by that margin).
        num_samples: Monte Carlo samples per row and step.
        pooled_weight: pseudo-samples of the pooled (all problems) lengths mixed into a problem's own.
        length_jitter: log-uniform jitter (standard deviation in log space) on sampled remaining lengths (finite
            history; breaks ties).
        extrapolation_fraction / min_remaining: a request past every observed length is given an exponential
            remaining length of mean ``max(min_remaining, extrapolation_fraction * generated)``.
        history_lengths: completion lengths kept per problem.
        acceptance_pseudocount / acceptance_decay / acceptance_ratio_floor: the controller's own acceptance
            correction (:attr:`BudgetController.acceptance_ratio`): pseudo-tokens at ratio 1, the factor applied to
            its sums at every step, and the bounds of the ratio.
        step_token_cap: cap of kept draft tokens per engine step (0 = none).
        seed: seed of the Monte Carlo generator (replays are deterministic).
        fit_window / fit_min_steps / fit_min_r2: :class:`~das_trl.budget.cost_model.OnlineCostFit` settings.
        backend: ``"auto"`` (the native kernel of the drafter's core when it is built and ``step_token_cap`` is 0,
            else numpy), ``"native"`` (required; ``ImportError`` at the first step without the core) or
            ``"python"`` (numpy, the reference). Both take the same random draws; results agree up to floating-point
            rounding (a near-tie in the draft-length argmin may go the other way).
        draft_row_us: the proposer's CPU time (microseconds) to draft one row for one step, charged in the decision
            before drafting (:meth:`BudgetController.plan`): vLLM runs the proposer on the engine's critical path, so
            a row is drafted only where its expected saving also pays for this. The default is what a drafted row
            costs the proposer on a 2-core machine in the replays (all of its CPU over its drafted rows: 30-50 us on
            the large-batch sets, of which the draft search and the row's own ingest ~20; docs/benchmarks.md, issue
            16); a faster host or more ``draft_threads`` lower it. 0: drafting is free (the controller before
            issue 16).
        gate_acceptance_prior / gate_prior_rounds: before drafting, a request's per-token acceptance is predicted
            from its own verified drafts with ``gate_prior_rounds`` pseudo-rounds at the engine-wide acceptance,
            which itself starts from ``gate_acceptance_prior`` (``das_trl.vllm.speculator``;
            :meth:`BudgetController.plan`).
        replan_steps / replan_shrink: the tail probabilities (the Monte Carlo over remaining lengths) are recomputed
            at least every ``replan_steps`` engine steps, whenever a request is new, and whenever the batch shrank
            below ``(1 - replan_shrink)`` of its size at the last computation; in between, each request keeps its
            probability (renormalised over the rows still running). 1 = every step.
        quiet_replan_max_steps: while consecutive recomputations draft no row, the interval between them doubles
            (``replan_steps``, 2x, 4x, ... up to this many steps; a value ``<= replan_steps`` disables the backoff),
            and it returns to ``replan_steps`` as soon as a plan drafts any row. At 256-320 rows a recomputation costs
            ~0.4-0.9 ms of the engine's step, so where nothing pays for a long stretch (large batches, expensive
            verification) recomputing every ``replan_steps`` costs ~0.1 ms per step for nothing; new requests,
            ``replan_shrink``, ``always_plan_rows`` and ``cost_source="online"`` still force a plan as before.
        always_plan_rows: batches of at most this many rows are recomputed every step (the tail, where the
            decision matters most and the computation is cheapest).
        tau_uncertainty: in :meth:`BudgetController.plan`'s tail probabilities, each sample's tokens per round is
            drawn around the row's observed one with this factor on its standard error (:func:`tau_samples`); 0: the
            observed one exactly (the controller before this setting). :meth:`BudgetController.budgets` (the single-call API) does not
            use it.
        gate_send_rounds: the gate charges a row's proposer CPU divided by the chance that its draft survives the cut
            (``send`` of :meth:`BudgetController.plan`; the Speculator's request book estimates it per request with
            this many pseudo-steps at the engine-wide rate); 0: every speculated row counts as sending. With the
            tail uncertainty alone, AMC23 at c_tok 0.1 speculated rows whose drafts the cut then dropped (78 %) and
            lost more CPU than it saved; with both, the replay suite's mean time without CPU vs the best of none and
            suffix goes 0.946 -> 0.941 and the rows speculated on AMC23 fall 16-20 % (docs/benchmarks.md, session 20).
    """

    c_base_ms: float = 7.0
    c_tok_ms: float = 0.025
    cost_source: str = "config"
    tail_prior_weight: float = 0.25
    draft_margin: float = 0.0
    num_samples: int = 32
    pooled_weight: float = 1.0
    length_jitter: float = 0.1
    extrapolation_fraction: float = 0.25
    min_remaining: int = 16
    history_lengths: int = 64
    acceptance_pseudocount: float = 32.0
    acceptance_decay: float = 0.98
    acceptance_ratio_floor: float = 0.5
    step_token_cap: int = 0
    seed: int = 0
    fit_window: int = 256
    fit_min_steps: int = 64
    fit_min_r2: float = 0.3
    backend: str = "auto"
    draft_row_us: float = 20.0
    gate_acceptance_prior: float = 0.5
    gate_prior_rounds: float = 2.0
    replan_steps: int = 8
    replan_shrink: float = 0.125
    always_plan_rows: int = 32
    quiet_replan_max_steps: int = 64
    tau_uncertainty: float = 1.0
    gate_send_rounds: float = 2.0

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"ControllerConfig: {msg}")

        for f in fields(self):  # every float setting is a real number (True / "x" would pass or fail obscurely below)
            v = getattr(self, f.name)
            if f.type in ("float", float):
                need(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)),
                     f"{f.name} must be a number, got {v!r}")
        CostModel(self.c_base_ms, self.c_tok_ms)  # validates both
        need(self.cost_source in _COST_SOURCES, f"cost_source must be one of {_COST_SOURCES}, got "
                                                f"{self.cost_source!r}")
        for name in ("num_samples", "history_lengths", "min_remaining", "fit_window", "fit_min_steps"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"{name} must be an int >= 1, got {v!r}")
        need(isinstance(self.step_token_cap, int) and self.step_token_cap >= 0,
             f"step_token_cap must be an int >= 0, got {self.step_token_cap!r}")
        need(0.0 <= self.tail_prior_weight <= 1.0, f"tail_prior_weight must be in [0, 1], got {self.tail_prior_weight}")
        need(self.pooled_weight >= 0.0, f"pooled_weight must be >= 0, got {self.pooled_weight}")
        need(self.acceptance_pseudocount > 0.0,
             f"acceptance_pseudocount must be > 0, got {self.acceptance_pseudocount}")
        need(0.0 < self.acceptance_decay <= 1.0, f"acceptance_decay must be in (0, 1], got {self.acceptance_decay}")
        need(0.0 < self.acceptance_ratio_floor <= 1.0,
             f"acceptance_ratio_floor must be in (0, 1], got {self.acceptance_ratio_floor}")
        need(self.draft_margin >= 0.0, f"draft_margin must be >= 0, got {self.draft_margin}")
        need(self.length_jitter >= 0.0, f"length_jitter must be >= 0, got {self.length_jitter}")
        need(self.extrapolation_fraction > 0.0,
             f"extrapolation_fraction must be > 0, got {self.extrapolation_fraction}")
        need(8 <= self.fit_window and 2 <= self.fit_min_steps <= self.fit_window,
             f"need fit_window >= 8 and 2 <= fit_min_steps <= fit_window, got {self.fit_window}, {self.fit_min_steps}")
        need(0.0 <= self.fit_min_r2 <= 1.0, f"fit_min_r2 must be in [0, 1], got {self.fit_min_r2}")
        need(self.backend in _BACKENDS, f"backend must be one of {_BACKENDS}, got {self.backend!r}")
        need(math.isfinite(self.draft_row_us) and self.draft_row_us >= 0.0,
             f"draft_row_us must be a finite number >= 0 (microseconds), got {self.draft_row_us}")
        need(0.0 < self.gate_acceptance_prior < 1.0,
             f"gate_acceptance_prior must be in (0, 1), got {self.gate_acceptance_prior}")
        need(self.gate_prior_rounds > 0.0, f"gate_prior_rounds must be > 0, got {self.gate_prior_rounds}")
        need(isinstance(self.replan_steps, int) and self.replan_steps >= 1,
             f"replan_steps must be an int >= 1, got {self.replan_steps!r}")
        need(0.0 <= self.replan_shrink < 1.0, f"replan_shrink must be in [0, 1), got {self.replan_shrink}")
        need(isinstance(self.always_plan_rows, int) and self.always_plan_rows >= 0,
             f"always_plan_rows must be an int >= 0, got {self.always_plan_rows!r}")
        need(math.isfinite(self.tau_uncertainty) and self.tau_uncertainty >= 0.0,
             f"tau_uncertainty must be a finite number >= 0, got {self.tau_uncertainty}")
        need(math.isfinite(self.gate_send_rounds) and self.gate_send_rounds >= 0.0,
             f"gate_send_rounds must be a finite number >= 0, got {self.gate_send_rounds}")
        need(isinstance(self.quiet_replan_max_steps, int) and not isinstance(self.quiet_replan_max_steps, bool)
             and self.quiet_replan_max_steps >= 0,
             f"quiet_replan_max_steps must be an int >= 0, got {self.quiet_replan_max_steps!r}")

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------- pure algebra
def remaining_samples(table: np.ndarray, counts: np.ndarray, pooled: np.ndarray, generated: np.ndarray,
                      max_remaining: np.ndarray | None, rng: np.random.Generator | np.ndarray, num_samples: int,
                      pooled_weight: float = 1.0, jitter: float = 0.1, extrapolation_fraction: float = 0.25,
                      min_remaining: float = 16.0) -> np.ndarray:
    """Sampled remaining lengths (tokens) per row, conditional on the tokens generated so far.

    Args:
        table: ``float64 [n, W]`` each row's problem lengths sorted ascending, :data:`~das_trl.drafter.
            length_table.PAD` before them (``LengthTable.gather``).
        counts: ``int [n]`` valid lengths per row (unused beyond validation: the padding is below any length).
        pooled: ``float64 [M]`` ascending pooled lengths of all problems (may be empty).
        generated: ``int/float [n]`` tokens generated so far.
        max_remaining: ``[n]`` most tokens each request may still generate (``inf`` or ``None``: no cap).
        rng: the generator (explicit state), or the draws themselves: ``float64 [4, n, S]`` uniforms in ``[0, 1)``
            (index, mixture, tail, jitter), e.g. :func:`stratified_draws`.
        num_samples: samples per row (S).
        pooled_weight, jitter, extrapolation_fraction, min_remaining: see :class:`ControllerConfig`.

    Returns:
        ``float64 [n, S]``, every value in ``[1, max_remaining]``.
    """
    n, w = table.shape
    g = np.asarray(generated, dtype=np.float64).reshape(n, 1)
    s = int(num_samples)
    # One generator call (or the given draws): index, mixture, tail and jitter draws.
    u, v, e, j = rng if isinstance(rng, np.ndarray) else rng.random((4, n, s))
    # The problem's own lengths above g are its last `above` columns (sorted ascending, padding first).
    above = (table > g).sum(axis=1, keepdims=True)
    own = np.take_along_axis(table, np.clip(w - above + (u * above).astype(np.int64), 0, w - 1), axis=1)
    m = len(pooled)
    if m:
        above_pool = (pooled[None, :] > g).sum(axis=1, keepdims=True)
        pool = pooled[np.clip(m - above_pool + (u * above_pool).astype(np.int64), 0, m - 1)]
    else:
        above_pool = np.zeros((n, 1), np.int64)
        pool = np.zeros((n, s))
    scale = np.maximum(float(min_remaining), extrapolation_fraction * g)
    extra = g - scale * np.log1p(-e)  # exponential tail past every observed length
    # Mixture: own lengths with weight `above`, pooled ones with `pooled_weight` pseudo-samples.
    p_pool = np.where(above_pool > 0, pooled_weight / np.maximum(above + pooled_weight, 1e-12), 0.0)
    use_pool = (v < p_pool) | ((above == 0) & (above_pool > 0))
    total = np.where(use_pool, pool, np.where(above > 0, own, extra))
    total = np.where(total > g, total, extra)  # a pooled draw can only be chosen above g; guard anyway
    rem = total - g
    if jitter > 0:  # log-uniform with standard deviation `jitter` in log space
        rem *= np.exp(jitter * math.sqrt(3.0) * (2.0 * j - 1.0))
    rem = np.maximum(rem, 1.0)
    if max_remaining is not None:
        cap = np.maximum(np.asarray(max_remaining, dtype=np.float64).reshape(n, 1), 1.0)
        rem = np.minimum(rem, cap)
    return rem


def stratified_draws(n: int, num_samples: int) -> np.ndarray:
    """Deterministic draws for :func:`remaining_samples`: ``float64 [4, n, S]``, the same ``S`` stratified points
    ``(t + 1/2) / S`` for every row, in four different orders (index, mixture, tail, jitter) so the four are not
    correlated. No generator state: the same inputs give the same budgets in every run (reproducible rollouts), and
    rows with the same inputs get the same samples (they tie exactly in the tail probability)."""
    s = int(num_samples)
    base = (np.arange(s, dtype=np.float64) + 0.5) / s
    orders = [np.arange(s), (np.arange(s) * 5 + 1) % s, (np.arange(s) * 11 + 3) % s, (np.arange(s) * 13 + 7) % s]
    if s > 1 and math.gcd(5, s) * math.gcd(11, s) * math.gcd(13, s) != 1:  # keep them permutations
        orders = [np.arange(s), np.arange(s)[::-1], np.roll(np.arange(s), s // 2), np.roll(np.arange(s)[::-1], s // 3)]
    rows = np.stack([base[o] for o in orders])  # [4, S]
    return np.ascontiguousarray(np.broadcast_to(rows[:, None, :], (4, n, s)))


def tau_quantiles(num_samples: int) -> np.ndarray:
    """``float64 [S]`` standard normal quantiles at ``(t + 1/2) / S``, in an order (``7 t + 2 mod S``) unrelated to
    the four of :func:`stratified_draws`, so a sample's tokens per round is not tied to its remaining length."""
    s = int(num_samples)
    order = (np.arange(s) * 7 + 2) % s if math.gcd(7, s) == 1 else np.arange(s)[::-1]
    z = np.array([_NORMAL.inv_cdf((t + 0.5) / s) for t in order])
    z.flags.writeable = False
    return z


def tau_samples(tau_obs: np.ndarray, rounds: np.ndarray, rem_mean: np.ndarray, z: np.ndarray,
                uncertainty: float = 1.0) -> np.ndarray:
    """Sampled tokens per round of each row for its remaining rounds: ``float64 [n, S]``, each ``>= 1``.

    A row's tokens per round so far (``tau_obs``) is a mean of a few noisy rounds, and its remaining rounds will
    average out to something else again: a row drafting at modest acceptance may finish well before or after its
    expected round. Its samples are ``tau_obs * exp(sd / tau_obs * z)``, log-normal with standard deviation
    ``sd = uncertainty * sqrt(max(tau_obs - 1, 0) + 1/4) * sqrt(1 / (rounds + 4) + 1 / max(rem_mean / tau_obs, 1))``:
    the per-round spread of the tokens a round emits (about ``tau - 1`` for geometric acceptance; a quarter of a
    token at least), over the rounds seen (with the estimate's 4 pseudo-rounds) and the rounds still to come. Without
    it every row keeps its observed speed exactly, and a crowd of requests cut at the same ``max_tokens`` lands in the
    same bin of :func:`tail_probability`'s histogram and shares the tail probability equally, whatever their speeds;
    with it, the rows that are slower (or whose speed is less certain) get more of it (replays: docs/benchmarks.md,
    session 20; ``ControllerConfig.tau_uncertainty``).

    Args:
        tau_obs: ``float64 [n]`` observed tokens per round (``>= 1``).
        rounds: ``[n]`` verification rounds so far.
        rem_mean: ``float64 [n]`` mean sampled remaining tokens.
        z: ``float64 [S]`` standard normal quantiles (:func:`tau_quantiles`).
        uncertainty: the factor on ``sd`` (0: exactly ``tau_obs``).
    """
    tau_obs = np.asarray(tau_obs, dtype=np.float64)
    seen = np.maximum(np.asarray(rounds, dtype=np.float64), 0.0) + _TAU_PSEUDO_ROUNDS
    ahead = np.maximum(rem_mean / tau_obs, 1.0)
    sd = uncertainty * np.sqrt(np.maximum(tau_obs - 1.0, 0.0) + 0.25) * np.sqrt(1.0 / seen + 1.0 / ahead)
    return np.maximum(tau_obs[:, None] * np.exp((sd / tau_obs)[:, None] * z[None, :]), 1.0)


def gate_rows(weight_ms: np.ndarray, q: np.ndarray, caps: np.ndarray, c_tok_ms: float,
              draft_row_ms: float | np.ndarray, draft_margin: float = 0.0) -> np.ndarray:
    """Which rows can pay for being drafted at all, decided before drafting (cheap: no draft, no survival).

    Row ``i`` drafting ``d`` tokens with per-token acceptance ``q_i`` emits ``1 + S_d`` tokens per round,
    ``S_d = q + q^2 + ... + q^d``, and costs ``c_tok (1 + (1 + margin) d) + draft_row_ms`` more per round than
    ``c_tok`` (its own verification and the proposer's CPU for the row); not drafting costs ``weight + c_tok`` per
    token of progress. Drafting pays iff some ``d`` in ``1 .. caps[i]`` has
    ``c_tok (1 + margin) d + draft_row_ms < (weight + c_tok) S_d`` (the cost per token of progress falls).

    Args:
        weight_ms: ``float64 [n]`` ``c_base * P_i`` (what a round of row ``i`` adds to the makespan's cost).
        q: ``float64 [n]`` predicted per-token acceptance in ``[0, 1)``.
        caps: ``int [n]`` most draft tokens row ``i`` may get (0: never drafted; above :data:`MAX_CAP`: that).
        c_tok_ms / draft_row_ms: ms per verified token / ms of proposer CPU per drafted row (a number, or
            ``float64 [n]`` one per row).

    Returns:
        ``bool [n]``.
    """
    caps = np.asarray(caps)
    if caps.dtype.kind not in "iu":  # any integer dtype compares exactly; others as before (truncated to int64)
        caps = caps.astype(np.int64)
    q = np.maximum(np.asarray(q, dtype=np.float64), 0.0)  # np.clip(q, 0, 0.999) in two ufunc calls
    np.minimum(q, 0.999, out=q)
    value = np.asarray(weight_ms, dtype=np.float64) + c_tok_ms
    # S_d < q / (1 - q) and the cost is smallest at d = 1: rows failing that bound are out without the [n, K] work
    # (in a large batch where nothing pays, that is every row).
    out = (value * q / (1.0 - q) > c_tok_ms * (1.0 + draft_margin) + draft_row_ms) & (caps > 0)
    rows = out.nonzero()[0]
    m = len(rows)
    if m:
        per_row = np.ndim(draft_row_ms) > 0
        if m < len(out):
            q, value, caps = q[rows], value[rows], caps[rows]
            if per_row:
                draft_row_ms = np.asarray(draft_row_ms)[rows]
        k = min(int(np.maximum.reduce(caps)), MAX_CAP)
        d = _arange_1(k)
        s_d = (q[:, None] ** d).cumsum(axis=1)  # [m, k]
        cost = c_tok_ms * (1.0 + draft_margin) * d + (np.asarray(draft_row_ms)[:, None] if per_row else draft_row_ms)
        ok = value[:, None] * s_d > cost
        ok &= d <= caps[:, None]
        out[rows] = np.logical_or.reduce(ok, axis=1)
    return out


#: The fewest draft tokens :func:`draft_caps` gives a drafted row (the native kMinDraftCap).
MIN_DRAFT_CAP = 4


def draft_caps(weight_ms: np.ndarray, q: np.ndarray, caps: np.ndarray, c_tok_ms: float, ratio: float = 1.0,
               draft_margin: float = 0.0) -> np.ndarray:
    """How many tokens to draft for rows the gate drafts, before drafting: a row's per-token value of progress is
    at most ``weight + c_tok`` (its cost per token without a draft), so a draft position whose estimate (after the
    cut's ``acceptance_ratio`` correction) is below ``floor = c_tok (1 + margin) / (ratio' (weight + c_tok))``, with
    ``ratio' = max(ratio, 1)``, can never pay; a draft of per-token acceptance ``q`` stays above it for
    ``log(floor) / log(q)`` positions, and drafts vary around the row's average, so the cap allows twice that:
    ``ceil(2 log(floor) / log(q))``, at least :data:`MIN_DRAFT_CAP`, at most ``caps``. In a large batch (small
    weights) rows draft a few tokens; the rows likely to set the makespan draft up to their hard cap. Drafting
    cost grows with the length walked in each source, on the engine's critical path.

    Args:
        weight_ms / q: ``float64 [n]`` as :func:`gate_rows`.
        caps: ``int [n]`` hard caps (above :data:`MAX_CAP`: that).
        c_tok_ms / ratio / draft_margin: ms per verified token, :attr:`BudgetController.acceptance_ratio`,
            ``ControllerConfig.draft_margin``.

    Returns:
        ``int32 [n]``, each in ``[min(caps, MIN_DRAFT_CAP), caps]``.
    """
    caps = np.minimum(np.asarray(caps), MAX_CAP).astype(np.int64)  # clamp first: uint64 2**63 wraps in int64
    qi = np.minimum(np.maximum(np.asarray(q, dtype=np.float64), 0.0), 0.999)
    floor = c_tok_ms * (1.0 + draft_margin) / ((np.asarray(weight_ms, dtype=np.float64) + c_tok_ms) * max(ratio, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        reach = 2.0 * np.log(floor) / np.log(qi)
    ok = (floor < 1.0) & (qi > 0.0)
    out = np.where(ok & ~(reach < caps), caps,
                   np.minimum(caps, np.maximum(MIN_DRAFT_CAP, np.ceil(np.where(ok, reach, 0.0)))))
    out = np.where(ok, out, np.minimum(caps, MIN_DRAFT_CAP))
    return out.astype(np.int32)


_ARANGE_1: dict[int, np.ndarray] = {}


def _arange_1(k: int) -> np.ndarray:
    """``float64 [k]`` ``1, 2, .., k`` (cached per ``k``; read only)."""
    d = _ARANGE_1.get(k)
    if d is None:
        d = np.arange(1, k + 1, dtype=np.float64)
        d.flags.writeable = False
        if len(_ARANGE_1) < 256:
            _ARANGE_1[k] = d
    return d


def tail_probability(rounds: np.ndarray, bins: int = 64) -> tuple[np.ndarray, float]:
    """Probability that each row needs the most rounds, from sampled rounds to finish.

    Counting how often each row is the sample maximum resolves nothing below ``1 / S`` (a row never the maximum
    in 64 samples would get exactly 0, and at cheap verification a 1 % chance of being last is worth drafting for).
    Instead each row's samples give its distribution over ``bins`` log-spaced bins, and
    ``P_i = sum_g pmf_i(g) * prod_{j != i} mid_j(g)`` with ``mid_j(g) = P(R_j < g) + pmf_j(g) / 2`` (a row in the
    same bin is below with probability one half), in O(n bins); the result is normalised to sum to 1.

    Args:
        rounds: ``float64 [n, S]`` sampled rounds to finish per row (n >= 1, values >= 0).
        bins: grid size.

    Returns:
        ``(P, makespan)``: ``float64 [n]``, and the expected maximum over the samples (rounds until the last request
        finishes). Rows cut at the same ``max_tokens`` tie and share ``P`` equally.
    """
    n, s = rounds.shape
    makespan = float(rounds.max(axis=0).mean())
    if n == 1:
        return np.ones(1), makespan
    x = np.log1p(np.maximum(rounds, 0.0))
    top = float(x.max())
    b = np.zeros(x.shape, np.int64) if top <= 0 else np.minimum((x * (bins / top)).astype(np.int64), bins - 1)
    pmf = np.bincount((np.arange(n)[:, None] * bins + b).ravel(), minlength=n * bins).reshape(n, bins) / s
    mid = np.cumsum(pmf, axis=1) - 0.5 * pmf
    zero = mid <= 0.0
    logmid = np.log(np.where(zero, 1.0, mid))
    total = logmid.sum(axis=0)  # [bins]: log prod over the rows with mid > 0
    zeros = zero.sum(axis=0)    # [bins]: rows with mid == 0 (a row's own sample bins always have mid > 0)
    # sum_g pmf_i(g) f(g) is the mean of f over row i's own samples: evaluate the product at their bins only.
    others = np.where(zeros[b] == 0, np.exp(total[b] - np.take_along_axis(logmid, b, axis=1)), 0.0)
    p = others.mean(axis=1)
    tot = p.sum()
    return (p / tot if tot > 0 else np.full(n, 1.0 / n)), makespan


def survival(remaining: np.ndarray, k: int) -> np.ndarray:
    """``float64 [n, k]``: column ``j`` is the share of row ``i``'s samples with more than ``j + 1`` tokens to go,
    i.e. the probability that draft position ``j`` is not past the request's end (the token after an accepted
    draft is always the round's own, so position ``j`` needs ``j + 2`` remaining tokens). ``remaining``:
    ``float64 [n, S]``. One ``bincount``, O(n S)."""
    n, s = remaining.shape
    if k <= 0 or n == 0:
        return np.ones((n, max(k, 0)))
    v = np.minimum(np.floor(remaining), k + 1).astype(np.int64)
    hist = np.bincount((np.arange(n)[:, None] * (k + 2) + v).ravel(), minlength=n * (k + 2)).reshape(n, k + 2)
    return 1.0 - np.cumsum(hist, axis=1)[:, 1:k + 1] / s


def optimal_draft_lengths(accept: np.ndarray, weight_ms: np.ndarray, c_tok_ms: float,
                          draft_margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the draft length minimising the cost per token of progress (see the module docstring).

    Args:
        accept: ``float64 [n, K]`` cumulative acceptance estimates (non-increasing along a row; 0 past the draft).
        weight_ms: ``float64 [n]`` ``c_base * P_i``: what one round of row ``i`` adds to the makespan's cost.
        c_tok_ms: ms per verified token.

    Returns:
        ``(lengths, value)``: ``int32 [n]`` in ``[0, K]``, and ``float64 [n]`` the value (ms) of one token of
        progress at that length, ``V_i = (weight_i + c_tok (1 + d_i)) / tau_i(d_i)``.
    """
    n, k = accept.shape
    tau = np.empty((n, k + 1))
    tau[:, 0] = 1.0
    np.cumsum(accept, axis=1, out=tau[:, 1:])
    tau[:, 1:] += 1.0
    per_round = weight_ms[:, None] + c_tok_ms * (1.0 + (1.0 + draft_margin) * np.arange(k + 1, dtype=np.float64))[None, :]
    ratio = per_round / tau
    # Ties (e.g. acceptance exactly 1 with nothing to gain) go to the shorter draft, whatever the rounding.
    d = (ratio * (1.0 + 1e-9 * np.arange(k + 1))[None, :]).argmin(axis=1)
    value = ratio[np.arange(n), d]
    return d.astype(np.int32), value


def apply_step_cap(accept: np.ndarray, lengths: np.ndarray, value_ms: np.ndarray, c_tok_ms: float,
                   cap: int) -> np.ndarray:
    """Cut the step's total draft tokens to ``cap``, dropping the smallest marginal gains ``accept * V - c_tok``
    first (each row stays a prefix: gains are non-increasing along a row). ``lengths``: ``int [n]``; returns a new
    ``int32 [n]``; unchanged when ``cap <= 0`` or the total fits."""
    lengths = np.asarray(lengths, dtype=np.int32)
    total = int(lengths.sum())
    if cap <= 0 or total <= cap:
        return lengths.copy()
    n, k = accept.shape
    mask = np.arange(k)[None, :] < lengths[:, None]
    gain = accept * value_ms[:, None] - c_tok_ms
    vals = gain[mask]
    kth = np.partition(vals, len(vals) - cap)[len(vals) - cap]
    keep = mask & (gain > kth)
    ties = np.flatnonzero((mask & (gain == kth)).ravel())[: cap - int(keep.sum())]
    keep.ravel()[ties] = True
    return keep.sum(axis=1).astype(np.int32)


# ---------------------------------------------------------------------------- controller
@dataclass
class StepPlan:
    """The controller's decision for one engine step before drafting (:meth:`BudgetController.plan`).

    Attributes:
        draft: ``bool [n]`` rows worth drafting this step (the others are not drafted at all).
        weight_ms: ``float64 [n]`` ``c_base * P_i``: what one more round of row ``i`` adds to the batch's expected
            cost (``P_i``: probability that row ``i`` finishes last, shrunk towards ``1 / n``).
        problem_keys / generated / max_remaining: the rows' inputs (``int64`` / ``float64 [n]``; ``max_remaining``
            ``None`` when uncapped), kept for :meth:`BudgetController.cut`.
        replanned: whether the tail probabilities were recomputed this step.
        budget: ``int32 [n]`` how many tokens to draft per row (:func:`draft_caps` for the drafted rows, 0 for the
            others); every plan :meth:`BudgetController.plan` returns has one.
    """

    draft: np.ndarray
    weight_ms: np.ndarray
    problem_keys: np.ndarray
    generated: np.ndarray
    max_remaining: np.ndarray | None
    replanned: bool = False
    budget: np.ndarray | None = None


class BudgetController:
    """Per-step draft budgets for a batch (see the module docstring).

    State: the per-problem length table (:meth:`observe`), the Monte Carlo generator, the online cost fit
    (:meth:`observe_step`), counters for :meth:`stats`, and the last step's diagnostics (``last_tail_prob``,
    ``last_expected_remaining``: ``float64 [n]``; ``last_expected_makespan``: rounds).

    The config is read as fixed: the native kernels (``backend``) and their settings are resolved once, at the first
    step that needs them, because :meth:`plan` / :meth:`cut` run on the engine's critical path every step (to change
    a setting, build a new controller, as the proposer does).

    Not thread-safe (the proposer / replay serialises calls).
    """

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config if config is not None else ControllerConfig()
        cfg = self.config
        self.lengths = LengthTable(cfg.history_lengths)
        self.rng = np.random.default_rng(cfg.seed)
        self.fit = OnlineCostFit(cfg.fit_window, cfg.fit_min_steps, cfg.fit_min_r2)
        self._config_cost = CostModel(cfg.c_base_ms, cfg.c_tok_ms)
        self._acc_expected = 0.0
        self._acc_accepted = 0.0
        self.last_expected_kept = np.zeros(0)
        self.last_tail_prob = np.zeros(0)
        self.last_expected_remaining = np.zeros(0)
        self.last_expected_makespan = 0.0
        self._counters = {"steps": 0, "rows": 0, "rows_drafting": 0, "offered_tokens": 0, "kept_tokens": 0,
                          "expected_accepted": 0.0, "tail_rows": 0, "capped_steps": 0, "rows_speculated": 0,
                          "silent_steps": 0, "replans": 0, "quiet_steps": 0}
        self._last_silent = False  # the last plan drafted no row
        # plan(): tail probabilities kept per request slot between recomputations (grown by doubling).
        self._slot_p = np.zeros(0, np.float64)
        self._slot_epoch = np.full(0, -1, np.int64)
        self._epoch = 0
        self._rows_seen_epoch = -1  # the epoch at which the last plan / quiet_step saw every one of its rows
        self._since_plan = 0
        self._rows_at_plan = 0
        # Steps between recomputations: replan_steps, doubled (up to quiet_replan_max_steps) after each recomputation
        # that drafted nothing when the one before it drafted nothing too; back to replan_steps when a plan drafts.
        self._replan_interval = cfg.replan_steps
        self._silent_replans = 0  # consecutive recomputations that drafted no row
        self._draws: dict[int, np.ndarray] = {}
        # Per-call constants of the hot path (plan / cut run once per engine step): the resolved native kernels, the
        # kernels' settings (only "ratio" / "c_base_ms" / "c_tok_ms" are set per call; the kernel reads the dict during
        # the call only), and buffers sliced per batch size.
        self._online = cfg.cost_source == "online"
        self._kernels: dict[str, object] = {}
        shared = {"draft_margin": cfg.draft_margin, "pooled_weight": cfg.pooled_weight,
                  "length_jitter": cfg.length_jitter, "extrapolation_fraction": cfg.extrapolation_fraction,
                  "min_remaining": float(cfg.min_remaining)}
        self._cut_params = {"ratio": 1.0, "c_tok_ms": cfg.c_tok_ms, **shared}
        self._plan_params = {"tail_prior_weight": cfg.tail_prior_weight, "c_base_ms": cfg.c_base_ms,
                             "c_tok_ms": cfg.c_tok_ms, "draft_row_ms": cfg.draft_row_us / 1000.0,
                             "tau_uncertainty": cfg.tau_uncertainty, **shared}
        # The stratified draws are the same for every row: the kernels take them once ([4, 1, S]), not per row.
        self._shared_draws = stratified_draws(1, cfg.num_samples)
        # plan(): one standard normal quantile per sample for the tokens-per-round uncertainty (empty: off).
        self._tau_z = tau_quantiles(cfg.num_samples) if cfg.tau_uncertainty > 0 else np.zeros(0)
        self._no_f64, self._no_i64 = np.zeros(0), np.zeros(0, np.int64)
        self._no_table = np.zeros((0, 1))
        self._budget_params = {"ratio": 1.0, "tail_prior_weight": cfg.tail_prior_weight, "c_base_ms": cfg.c_base_ms,
                               "c_tok_ms": cfg.c_tok_ms, **shared}
        self._inf = np.full(0, np.inf)            # [>= n] inf (uncapped rows), sliced; never written
        self._ones = np.ones(0)                   # [>= n] 1.0 (tau_obs without num_rounds), sliced; never written
        self._scratch_f64 = np.empty((0, 0))      # [2, >= n] kernel outputs this class does not read

    # ------------------------------------------------------------------ inputs between steps
    def observe(self, problem_key: int, lengths) -> None:
        """Completion lengths (tokens) of one appearance of a problem (call on every history push)."""
        self.lengths.observe(problem_key, lengths)

    def history_pushed(self) -> None:
        """New history arrived: the next step recomputes its plan (the quiet backoff starts over), since what the
        drafter can offer changed."""
        self._replan_interval = self.config.replan_steps
        self._silent_replans = 0
        self._since_plan = self._replan_interval  # due at the next step

    def observe_step(self, tokens: int, ms: float) -> None:
        """One engine step's tokens and duration (ms), for ``cost_source="online"``."""
        self.fit.add(tokens, ms)

    def observe_acceptance(self, expected: float, accepted: int) -> None:
        """How a kept draft fared: ``expected`` = its entry of :attr:`last_expected_kept` (the estimates of the
        tokens kept, end-of-request survival included), ``accepted`` = tokens verification accepted.

        The controller keeps the tokens with the highest estimates, so the drafter's calibration (which learns from
        every verified token) is optimistic about exactly those (measured: 45 % estimated, 26 % accepted on the
        T = 1.0 frozen set at c_tok = 0.1). :attr:`acceptance_ratio` scales the estimates the controller decides on.
        """
        self._acc_expected += max(float(expected), 0.0)
        self._acc_accepted += max(float(accepted), 0.0)

    @property
    def acceptance_ratio(self) -> float:
        """Observed / expected accepted tokens of kept drafts, ``(accepted + s) / (expected + s)`` with ``s =
        acceptance_pseudocount``, both sums multiplied by ``acceptance_decay`` at every step, clipped to
        ``[acceptance_ratio_floor, 1 / acceptance_ratio_floor]``; 1.0 before any observation.

        The decay makes old evidence fade even when nothing is kept (so a ratio that stopped all drafting recovers),
        and the floor bounds the correction: the drafter's own calibration learns from the same outcomes, so early in
        a run (no calibration yet) the two corrections would compound. Without them, on the AMC23 set (one history
        appearance, no warm-up) the first step's outcomes drove the ratio to 0.02 and nothing was drafted again."""
        cfg = self.config
        s = cfg.acceptance_pseudocount
        ratio = (self._acc_accepted + s) / (self._acc_expected + s)
        return float(min(max(ratio, cfg.acceptance_ratio_floor), 1.0 / cfg.acceptance_ratio_floor))

    @property
    def cost(self) -> CostModel:
        """The cost model in use: the online fit when ``cost_source="online"`` and the fit is trusted, else the
        config's."""
        if self._online:
            fitted = self.fit.estimate()
            if fitted is not None:
                return fitted
        return self._config_cost

    def _grow(self, n: int) -> None:
        """Grow the sliced per-call buffers (``_inf``, ``_ones``, ...) to at least ``n`` rows (by doubling)."""
        size = max(n, 2 * len(self._inf), 64)
        cfg = self.config
        self._inf = np.full(size, np.inf)
        self._ones = np.ones(size)
        self._prior = np.full(size, cfg.gate_acceptance_prior)
        self._caps16 = np.full(size, 16, np.int64)
        self._caps16_i32 = np.full(size, 16, np.int32)
        self._scratch_f64 = np.empty((2, size))

    # ------------------------------------------------------------------ per step: plan, draft, cut
    def _stratified(self, n: int) -> np.ndarray:
        draws = self._draws.get(n)
        if draws is None:
            if len(self._draws) >= 8:  # bounded: a handful of batch sizes are live at once
                self._draws.pop(next(iter(self._draws)))
            draws = self._draws[n] = stratified_draws(n, self.config.num_samples)
        return draws

    def _tail(self, keys: np.ndarray, out_len: np.ndarray, cap: np.ndarray | None, tau_obs: np.ndarray,
              rounds: np.ndarray | None = None) -> np.ndarray:
        """Probability that each row finishes last (normalised, before the prior shrink), from deterministic
        stratified samples of the remaining lengths (:func:`stratified_draws`) and, with ``tau_uncertainty``, of the
        tokens per round (:func:`tau_samples`), in numpy: the reference of the ``controller_plan`` kernel
        (:meth:`_plan_native`). ``rounds``: verification rounds so far (``None``: ``out_len``, 1 token per round).
        ``float64 [n]``."""
        cfg = self.config
        table, counts, pooled = self.lengths.gather(keys)
        rem = remaining_samples(table, counts, pooled, out_len, cap, self._stratified(len(keys)), cfg.num_samples,
                                cfg.pooled_weight, cfg.length_jitter, cfg.extrapolation_fraction, cfg.min_remaining)
        rem_mean = rem.mean(axis=1)
        if cfg.tau_uncertainty > 0:
            tau = tau_samples(tau_obs, out_len if rounds is None else rounds, rem_mean, self._tau_z, cfg.tau_uncertainty)
        else:
            tau = tau_obs[:, None]
        p, makespan = tail_probability(rem / tau)
        self.last_expected_remaining = rem_mean
        self.last_expected_makespan = float(makespan)
        return p

    def plan(self, problem_keys: np.ndarray, output_len: np.ndarray, num_rounds: np.ndarray | None = None,
             max_output: np.ndarray | None = None, caps: np.ndarray | None = None,
             acceptance: np.ndarray | None = None, slots: np.ndarray | None = None,
             send: np.ndarray | None = None) -> StepPlan:
        """Decide, before drafting, which rows of this engine step are worth drafting at all.

        The tail probability ``P_i`` (who finishes last; module docstring) is computed from deterministic stratified
        samples and, with ``slots``, kept per request between recomputations (``replan_steps``, backed off up to
        ``quiet_replan_max_steps`` while recomputations draft nothing; ``replan_shrink``; ``always_plan_rows``). A
        row is drafted when even its predicted acceptance can pay for its verification and for the proposer's CPU
        (``draft_row_us``, divided by the row's chance of sending a draft at all) (:func:`gate_rows`); the rest are
        not drafted, so a step where nothing pays costs the proposer almost nothing.

        Args:
            problem_keys: ``int64 [n]`` problem of each row.
            output_len: ``int [n]`` tokens each request generated so far.
            num_rounds: ``int [n]`` verification rounds each request had so far (``None``: 1 token per round).
            max_output: ``int [n]`` each request's maximum output tokens (``None``: no cap).
            caps: ``int [n]`` most draft tokens per row (``None``: 16); rows with cap 0 are never drafted.
            acceptance: ``float64 [n]`` predicted per-token acceptance of each row's draft (``None``: the config's
                ``gate_acceptance_prior``); the proposer derives it from the request's own verified drafts.
            slots: ``int [n]`` a stable id per request (``>= 0``, reused only after the request ended) under which
                its tail probability is kept between recomputations (``None``: recompute every step).
            send: ``float64 [n]`` each row's chance in ``[0, 1]`` that its draft, if speculated, survives the cut
                (``PlanInputs.send``; ``None``: 1); the gate charges ``draft_row_us / max(send, 0.05)``.

        Returns:
            :class:`StepPlan`.

        Raises:
            ValueError: shapes disagree, a slot outside ``[0, MAX_SLOTS)``, fractional or (at a recomputation)
                repeated, an acceptance or send rate outside ``[0, 1]`` or NaN, or a negative / NaN output length,
                round count or max output (nothing changed).
        """
        keys = np.asarray(problem_keys, dtype=np.int64)
        if keys.ndim != 1:
            keys = keys.reshape(-1)
        n = len(keys)
        out_len = np.asarray(output_len, dtype=np.float64)
        if out_len.ndim != 1:
            out_len = out_len.reshape(-1)
        # Each input converted once (no copy when it already has the dtype: the Speculator's int64 / float64 arrays);
        # caps keeps any integer dtype (gate_rows compares it exactly).
        r = None if num_rounds is None else np.asarray(num_rounds, dtype=np.float64)
        mo = None if max_output is None else np.asarray(max_output, dtype=np.float64)
        caps_arr = None if caps is None else np.asarray(caps)
        q = None if acceptance is None else np.asarray(acceptance, dtype=np.float64)
        snd = None if send is None else np.asarray(send, dtype=np.float64)
        sl = None if slots is None else np.asarray(slots)
        if sl is not None and sl.dtype != np.int64:
            with np.errstate(invalid="ignore"):  # NaN casts to INT_MIN: rejected just below
                as_int = sl.astype(np.int64)
            if sl.dtype.kind not in "iu" and not np.array_equal(as_int, sl):  # 1.7 would silently be slot 1
                raise ValueError("BudgetController.plan: slots must be whole numbers (one id per request)")
            sl = as_int
        shape = (n,)
        if out_len.shape != shape or (r is not None and r.shape != shape) or (mo is not None and mo.shape != shape) \
                or (caps_arr is not None and caps_arr.shape != shape) or (q is not None and q.shape != shape) \
                or (sl is not None and sl.shape != shape) or (snd is not None and snd.shape != shape):
            for name, v in (("output_len", out_len), ("num_rounds", r), ("max_output", mo), ("caps", caps_arr),
                            ("acceptance", q), ("slots", sl), ("send", snd)):
                if v is not None and v.shape != shape:
                    raise ValueError(f"BudgetController.plan: {name} must have shape ({n},) like problem_keys, got "
                                     f"{v.shape}")
        cfg = self.config
        cost = self.cost if self._online else self._config_cost
        if sl is not None and n and int(np.minimum.reduce(sl)) < 0:
            raise ValueError(f"BudgetController.plan: slots must be >= 0, got {int(sl.min())}")
        cap = None if mo is None else mo - out_len
        if n == 0:
            self._acc_expected *= cfg.acceptance_decay
            self._acc_accepted *= cfg.acceptance_decay
            return StepPlan(np.zeros(0, bool), np.zeros(0), keys, out_len, cap, budget=np.zeros(0, np.int32))
        if n > len(self._inf):
            self._grow(n)
        replan = sl is None or n <= cfg.always_plan_rows or self._since_plan + 1 >= self._replan_interval \
            or n < (1.0 - cfg.replan_shrink) * self._rows_at_plan
        if sl is not None:
            top = int(np.maximum.reduce(sl))
            if top >= MAX_SLOTS:  # the stored probabilities are indexed by slot
                raise ValueError(f"BudgetController.plan: slots must be below {MAX_SLOTS} (one per running request), "
                                 f"got {top}")
            # A request not seen at the last computation (slot epochs never exceed the current epoch).
            if not replan:
                replan = top >= len(self._slot_epoch) or int(np.minimum.reduce(self._slot_epoch[sl])) < self._epoch
            # Two rows under one slot would overwrite each other's stored probability (checked where it is written).
            if replan and n > 1 and int(np.maximum.reduce(np.bincount(sl))) > 1:
                raise ValueError(f"BudgetController.plan: slots must be distinct (one per running request), got "
                                 f"slot {int(np.bincount(sl).argmax())} more than once")
            if replan and top >= len(self._slot_p):
                size = max(top + 1, 2 * len(self._slot_p), 64)
                self._slot_p = np.concatenate([self._slot_p, np.zeros(size - len(self._slot_p))])
                self._slot_epoch = np.concatenate([self._slot_epoch, np.full(size - len(self._slot_epoch), -1, np.int64)])
        kernel = self._kernels.get("controller_plan", _UNSET)
        if kernel is _UNSET:
            kernel = self._native_kernel("controller_plan")
        ratio = self.acceptance_ratio  # the cut's correction, as of this step (draft_caps allows for it)
        if kernel is not None:
            draft, weight, p, drafted, tails, budget = self._plan_native(kernel, keys, out_len, r, mo, caps_arr, q, sl,
                                                                         replan, cost, snd, ratio)
        else:
            # (the native kernel checks these itself, in its loop over the rows; NaN fails every comparison: a NaN
            # acceptance was silently never drafted, one above 1 counted as 0.999)
            if not (np.minimum.reduce(out_len) >= 0.0 and (mo is None or np.minimum.reduce(mo) >= 0.0)
                    and (r is None or np.minimum.reduce(r) >= 0.0)):
                raise ValueError("BudgetController.plan: output_len, num_rounds and max_output must be numbers >= 0 "
                                 "(no NaN)")
            for name, v in (("acceptance", q), ("send", snd)):
                if v is not None and not (np.minimum.reduce(v) >= 0.0 and np.maximum.reduce(v) <= 1.0):
                    raise ValueError(f"BudgetController.plan: {name} must lie in [0, 1] (no NaN), got range "
                                     f"[{v.min()}, {v.max()}]")
            if replan:
                if r is None:
                    tau_obs = self._ones[:n]
                else:  # max(1, (out_len + 4) / (r + 4)), in place
                    tau_obs = out_len + _TAU_PSEUDO_ROUNDS
                    tau_obs /= r + _TAU_PSEUDO_ROUNDS
                    np.maximum(tau_obs, 1.0, out=tau_obs)
                p = self._tail(keys, out_len, cap, tau_obs, r)
                if sl is not None:
                    self._slot_p[sl] = p
                    self._slot_epoch[sl] = self._epoch + 1
            else:
                p = self._slot_p[sl]
                tot = float(np.add.reduce(p))
                if tot > 0:
                    p /= tot
                else:
                    p = np.full(n, 1.0 / n)
            w = cfg.tail_prior_weight
            p = (1.0 - w) * p
            p += w / n
            weight = cost.c_base_ms * p
            row_ms = cfg.draft_row_us / 1000.0
            if snd is not None:  # the row's CPU per draft that survives the cut
                row_ms = row_ms / np.maximum(snd, _MIN_SEND)
            qq = self._prior[:n] if q is None else q
            cc = self._caps16[:n] if caps_arr is None else caps_arr
            draft = gate_rows(weight, qq, cc, cost.c_tok_ms, row_ms, cfg.draft_margin)
            budget = np.zeros(n, np.int32)
            rows = draft.nonzero()[0]  # the caps of the drafted rows only (in a large batch, few or none)
            drafted = len(rows)
            if drafted:
                budget[rows] = draft_caps(weight[rows], np.asarray(qq)[rows], np.asarray(cc)[rows], cost.c_tok_ms,
                                          ratio, cfg.draft_margin)
            tails = int(np.count_nonzero(p >= 0.5))
        # Only now (a rejected call changed nothing): the acceptance record fades once per step.
        self._acc_expected *= cfg.acceptance_decay
        self._acc_accepted *= cfg.acceptance_decay
        if replan:
            self._counters["replans"] += 1
            self._since_plan = 0
            self._rows_at_plan = n
            self._epoch += 1
        else:
            self._since_plan += 1
        c = self._counters
        c["steps"] += 1
        c["rows"] += n
        c["rows_speculated"] += drafted
        self._last_silent = not drafted
        if drafted:
            self._silent_replans = 0
            self._replan_interval = cfg.replan_steps
        elif replan:  # the 2nd, 3rd, ... silent recomputation in a row doubles the interval (quiet_replan_max_steps)
            self._silent_replans += 1
            if self._silent_replans > 1 and cfg.quiet_replan_max_steps > cfg.replan_steps:
                self._replan_interval = min(2 * self._replan_interval, cfg.quiet_replan_max_steps)
        c["silent_steps"] += int(self._last_silent)
        c["tail_rows"] += tails
        self._rows_seen_epoch = self._epoch if sl is not None else -1  # every row is now a request this epoch saw
        self.last_tail_prob = p
        return StepPlan(draft, weight, keys, out_len, cap, replan, budget)

    def _plan_native(self, kernel, keys: np.ndarray, out_len: np.ndarray, r: np.ndarray | None,
                     mo: np.ndarray | None, caps: np.ndarray | None, q: np.ndarray | None, sl: np.ndarray | None,
                     replan: bool, cost: CostModel, send: np.ndarray | None = None, ratio: float = 1.0
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, np.ndarray]:
        """:meth:`plan` after its replan decision in one native call (``controller_plan``: tail probabilities or the
        stored ones renormalised, the shrink, weights, :func:`gate_rows` and :func:`draft_caps`; same arithmetic as
        the numpy path, so results agree up to the rounding of exp / log / pow). Returns ``(draft, weight, p,
        drafted, tail rows, budget)``."""
        n = len(keys)  # plan() grew the sliced buffers to n already
        if caps is None:
            caps = self._caps16_i32[:n]
        elif caps.dtype != np.int32:  # any integer dtype: above MAX_CAP counts as MAX_CAP, as in gate_rows
            caps = np.minimum(caps, MAX_CAP)
            caps = (np.maximum(caps, -1) if caps.dtype.kind == "i" else caps).astype(np.int32)
        empty = self._no_f64
        if replan:
            table, _, pooled = self.lengths.gather(keys)
            rem_mean = np.empty(n)
        else:
            table, pooled, rem_mean = self._no_table, empty, self._scratch_f64[0, :n]
        params = self._plan_params
        params["ratio"] = ratio
        if self._online:
            params["c_base_ms"], params["c_tok_ms"] = cost.c_base_ms, cost.c_tok_ms
        draft, weight, p, budget = np.empty(n, bool), np.empty(n), np.empty(n), np.empty(n, np.int32)
        makespan, drafted, tails = kernel(
            out_len, empty if r is None else r, empty if mo is None else mo, caps, self._prior[:n] if q is None else q,
            replan, table, pooled, self._shared_draws, self._no_i64 if sl is None else sl, self._slot_p,
            self._slot_epoch, self._epoch + 1, self._tau_z, empty if send is None else send, params, draft, weight, p,
            rem_mean, budget)
        if replan:
            self.last_expected_remaining = rem_mean
            self.last_expected_makespan = float(makespan)
        return draft, weight, p, drafted, tails, budget

    def quiet_step(self, slots: np.ndarray, same_rows: bool = False) -> bool:
        """Whether this engine step may skip :meth:`plan` and draft nothing, because nothing paid at the last plan
        and nothing that decision rests on was recomputed since: it drafted no row, the tail probabilities are not
        due (the rules of ``replan_steps`` / ``quiet_replan_max_steps``, ``replan_shrink`` and ``always_plan_rows``)
        and every row is a request the last plan saw. Between recomputations the gate therefore re-decides only when
        they are due (at most one interval minus one step later than a per-step gate would, as acceptance priors drift
        back: ``replan_steps - 1``, or up to ``quiet_replan_max_steps - 1`` once consecutive recomputations drafted
        nothing), and a step where nothing pays costs O(1) here instead of the plan's O(rows) array work. When it
        returns ``True`` the step is counted as planned and silent (``quiet_steps`` counts these); when ``False`` call
        :meth:`plan`.

        Args:
            slots: ``int [n]`` the rows' request slots, as given to :meth:`plan`.
            same_rows: the caller's promise that ``slots`` holds the same requests as at its previous call of
                :meth:`plan` or :meth:`quiet_step` (the Speculator knows it from the request ids): then, when no
                recomputation happened since, the check that the last plan saw every row is skipped (it passed
                already; O(rows) array work otherwise).
        """
        cfg = self.config
        n = len(slots)
        if not self._last_silent or n <= cfg.always_plan_rows or self._since_plan + 1 >= self._replan_interval \
                or n < (1.0 - cfg.replan_shrink) * self._rows_at_plan or self._online:
            return False
        # A request the last computation did not see (slot epochs never exceed the current epoch).
        if not (same_rows and self._rows_seen_epoch == self._epoch):
            if np.maximum.reduce(slots) >= len(self._slot_epoch) \
                    or np.minimum.reduce(self._slot_epoch[slots]) < self._epoch:
                return False
            self._rows_seen_epoch = self._epoch
        self._since_plan += 1
        self._acc_expected *= cfg.acceptance_decay
        self._acc_accepted *= cfg.acceptance_decay
        c = self._counters
        c["steps"] += 1
        c["rows"] += n
        c["silent_steps"] += 1
        c["quiet_steps"] += 1
        return True

    def cut(self, plan: StepPlan, accept: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Draft tokens to keep per drafted row (after drafting): the length that minimises the cost per token of
        progress (:func:`optimal_draft_lengths`) under the plan's ``weight_ms``, with each estimate scaled by the
        chance the position lies before the request's end (:func:`survival`, same deterministic samples) and by
        :attr:`acceptance_ratio`. Sets :attr:`last_expected_kept` for these rows.

        Args:
            plan: this step's :meth:`plan`.
            accept: ``float64 [m, K]`` cumulative acceptance estimates of the drafted rows (``DraftBatch.accept``).
            rows: ``int [m]`` the drafted rows' indices in the plan (``None``: every row, ``m = n``).

        Returns:
            ``int32 [m]``, ``0 <= kept[i] <=`` the row's draft length.

        Raises:
            ValueError: shapes disagree, ``rows`` outside the plan, or ``accept`` outside ``[0, 1]`` or NaN (nothing
                counted).
        """
        accept = np.asarray(accept, dtype=np.float64)
        if rows is None:
            idx = np.arange(len(plan.draft))
        else:
            idx = np.asarray(rows, dtype=np.int64)
            if idx.ndim != 1:
                idx = idx.reshape(-1)
        if accept.ndim != 2 or len(accept) != len(idx):
            raise ValueError(f"BudgetController.cut: accept must be [{len(idx)}, K] (one row per drafted row), got "
                             f"shape {accept.shape}")
        m, k = accept.shape
        if m == 0:
            self.last_expected_kept = np.zeros(0)
            return np.zeros(0, np.int32)
        if int(np.minimum.reduce(idx)) < 0 or int(np.maximum.reduce(idx)) >= len(plan.draft):
            raise ValueError(f"BudgetController.cut: rows must index the plan's {len(plan.draft)} rows, got "
                             f"[{int(idx.min())}, {int(idx.max())}]")
        cfg = self.config
        cost = self.cost if self._online else self._config_cost
        ratio = self.acceptance_ratio
        kernel = self._kernels.get("controller_cut", _UNSET)
        if kernel is _UNSET:
            kernel = self._native_kernel("controller_cut")
        c = self._counters
        if kernel is not None:
            # One call: the rows' inputs indexed, the range check of accept (NaN included), survival, the argmin and
            # the step's counters.
            table, _, pooled = self.lengths.gather(plan.problem_keys[idx])  # float64, C-contiguous
            capped, kept = np.empty(m, np.int32), np.empty(m)
            params = self._cut_params
            params["ratio"] = ratio
            params["c_tok_ms"] = cost.c_tok_ms
            if m > len(self._inf):
                self._grow(m)
            kept_tokens, drafting, offered, expected = kernel(
                np.ascontiguousarray(accept), table, pooled, idx, plan.generated,
                self._no_f64 if plan.max_remaining is None else plan.max_remaining, self._shared_draws,
                plan.weight_ms, params, capped, self._scratch_f64[0, :m], kept)
            c["rows_drafting"] += drafting
            c["offered_tokens"] += offered
            c["kept_tokens"] += kept_tokens
            c["expected_accepted"] += expected
            self.last_expected_kept = kept
            return capped
        if k and not (np.minimum.reduce(accept, axis=None) >= 0.0 and np.maximum.reduce(accept, axis=None) <= 1.0):
            raise ValueError(f"BudgetController.cut: accept must lie in [0, 1], got range [{accept.min()}, "
                             f"{accept.max()}]; pass DraftBatch.accept")
        weight = plan.weight_ms[idx]
        survival_k = self._survival(plan, idx, k)
        useful = np.minimum(accept * survival_k * ratio, 1.0)
        lengths, value = optimal_draft_lengths(useful, weight, cost.c_tok_ms, cfg.draft_margin)
        capped = apply_step_cap(useful, lengths, value, cost.c_tok_ms, cfg.step_token_cap)
        kept = np.where(np.arange(k)[None, :] < capped[:, None], accept * survival_k, 0.0).sum(axis=1)
        kept_tokens = int(np.add.reduce(capped))
        c["rows_drafting"] += int(np.count_nonzero(capped))  # kept lengths are >= 0
        c["offered_tokens"] += int(np.count_nonzero(accept > 0))
        c["kept_tokens"] += kept_tokens
        c["expected_accepted"] += float(np.add.reduce(kept))
        c["capped_steps"] += int(kept_tokens < int(np.add.reduce(lengths)))
        self.last_expected_kept = kept
        return capped

    def predicted_acceptance(self, plan: StepPlan, accept: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The per-position acceptance estimates :meth:`cut` decides on, for diagnostics (the replay's reliability
        record; not on the engine's path): ``min(accept * survival * acceptance_ratio, 1)``, recomputed in numpy
        from the same deterministic samples. Call right after the step's :meth:`cut` (the ratio moves with the next
        step's outcomes).

        Args:
            plan: the step's :meth:`plan`.
            accept: ``float64 [m, K]`` the drafted rows' cumulative estimates (``DraftBatch.accept``).
            rows: ``int [m]`` those rows' indices in the plan.

        Returns:
            ``float64 [m, K]``: entry ``[i, j]`` is the estimated probability that draft positions ``0 .. j`` of
            row ``i`` are all accepted, the request's end included.
        """
        accept = np.asarray(accept, dtype=np.float64)
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        m, k = accept.shape
        if m == 0:
            return np.zeros((0, k))
        return np.minimum(accept * self._survival(plan, idx, k) * self.acceptance_ratio, 1.0)

    def _survival(self, plan: StepPlan, idx: np.ndarray, k: int) -> np.ndarray:
        """``float64 [m, k]`` the chance that each draft position of the plan's rows ``idx`` lies before the
        request's end (:func:`survival` of :func:`remaining_samples`, the deterministic stratified draws)."""
        cfg = self.config
        table, counts, pooled = self.lengths.gather(plan.problem_keys[idx])  # float64, C-contiguous
        cap = None if plan.max_remaining is None else plan.max_remaining[idx]
        rem = remaining_samples(table, counts, pooled, plan.generated[idx], cap, self._stratified(len(idx)),
                                cfg.num_samples, cfg.pooled_weight, cfg.length_jitter, cfg.extrapolation_fraction,
                                cfg.min_remaining)
        return survival(rem, k)

    # ------------------------------------------------------------------ per step
    def budgets(self, accept: np.ndarray, problem_keys: np.ndarray, output_len: np.ndarray,
                num_rounds: np.ndarray | None = None, max_output: np.ndarray | None = None) -> np.ndarray:
        """Draft tokens to keep per row this step.

        Args:
            accept: ``float64 [n, K]`` cumulative acceptance estimates of each row's draft (``DraftBatch.accept``:
                non-increasing, 0 past the draft), already limited to the row's hard cap.
            problem_keys: ``int64 [n]`` problem of each row.
            output_len: ``int [n]`` tokens each request generated so far.
            num_rounds: ``int [n]`` verification rounds each request had so far (``None``: assume 1 token per
                round when estimating rounds to finish).
            max_output: ``int [n]`` each request's maximum output tokens (``None``: no cap).

        Returns:
            ``int32 [n]`` budgets, ``0 <= budget[i] <= `` row ``i``'s draft length, total ``<= step_token_cap``
            when that is set.

        Raises:
            ValueError: shapes disagree, ``accept`` is not 2-D or has values outside ``[0, 1]``.
        """
        accept = np.asarray(accept, dtype=np.float64)
        if accept.ndim != 2:
            raise ValueError(f"BudgetController.budgets: accept must be [n, K], got shape {accept.shape}")
        n, k = accept.shape
        keys = np.asarray(problem_keys, dtype=np.int64).reshape(-1)
        out_len = np.asarray(output_len, dtype=np.float64).reshape(-1)
        optional = {"num_rounds": num_rounds, "max_output": max_output}
        for name, arr in [("problem_keys", keys), ("output_len", out_len)] + [
                (name, np.asarray(v).reshape(-1)) for name, v in optional.items() if v is not None]:
            if arr.shape != (n,):
                raise ValueError(f"BudgetController.budgets: {name} must have shape ({n},) like accept's rows, got "
                                 f"{arr.shape}")
        if n == 0:
            return np.zeros(0, np.int32)
        if k and (accept.min() < 0.0 or accept.max() > 1.0):
            raise ValueError(f"BudgetController.budgets: accept must lie in [0, 1], got range "
                             f"[{accept.min()}, {accept.max()}]; pass DraftBatch.accept")
        cfg = self.config
        cost = self.cost if self._online else self._config_cost
        table, counts, pooled = self.lengths.gather(keys)
        cap = None if max_output is None else np.asarray(max_output, dtype=np.float64) - out_len
        if num_rounds is None:
            tau_obs = np.ones(n)
        else:
            r = np.asarray(num_rounds, dtype=np.float64)
            tau_obs = np.maximum(1.0, (out_len + _TAU_PSEUDO_ROUNDS) / (r + _TAU_PSEUDO_ROUNDS))
        # A draft token past the request's end is verified for nothing; the controller's own record of how its kept
        # tokens fared corrects the estimates it selects on (see observe_acceptance).
        self._acc_expected *= cfg.acceptance_decay
        self._acc_accepted *= cfg.acceptance_decay
        ratio = self.acceptance_ratio
        kernel = self._native_kernel()
        if kernel is not None:
            # Same draws as remaining_samples makes, in the same order; the rest of this method in one native call.
            draws = self.rng.random((4, n, cfg.num_samples))
            capped = lengths = np.empty(n, np.int32)
            p, kept, rem_mean = np.empty(n), np.empty(n), np.empty(n)
            params = self._budget_params
            params["ratio"] = ratio
            params["c_base_ms"] = cost.c_base_ms
            params["c_tok_ms"] = cost.c_tok_ms
            makespan = kernel(np.ascontiguousarray(accept), table, pooled, out_len,
                              np.full(n, np.inf) if cap is None else np.ascontiguousarray(cap, dtype=np.float64),
                              tau_obs, draws, params, lengths, np.empty(n), p, kept, rem_mean)
        else:
            rem = remaining_samples(table, counts, pooled, out_len, cap, self.rng, cfg.num_samples,
                                    cfg.pooled_weight, cfg.length_jitter, cfg.extrapolation_fraction,
                                    cfg.min_remaining)
            survival_k = survival(rem, k)
            useful = np.minimum(accept * survival_k * ratio, 1.0)
            p, makespan = tail_probability(rem / tau_obs[:, None])
            p = (1.0 - cfg.tail_prior_weight) * p + cfg.tail_prior_weight / n
            lengths, value = optimal_draft_lengths(useful, cost.c_base_ms * p, cost.c_tok_ms, cfg.draft_margin)
            capped = apply_step_cap(useful, lengths, value, cost.c_tok_ms, cfg.step_token_cap)
            kept_mask = np.arange(k)[None, :] < capped[:, None]
            kept = np.where(kept_mask, accept * survival_k, 0.0).sum(axis=1)
            rem_mean = rem.mean(axis=1)
        c = self._counters
        c["steps"] += 1
        c["rows"] += n
        c["rows_drafting"] += int((capped > 0).sum())
        c["offered_tokens"] += int((accept > 0).sum())
        c["kept_tokens"] += int(capped.sum())
        c["expected_accepted"] += float(kept.sum())
        c["tail_rows"] += int((p >= 0.5).sum())
        c["capped_steps"] += int(capped.sum() < lengths.sum())
        self.last_expected_kept = kept
        self.last_tail_prob = p
        self.last_expected_remaining = rem_mean
        self.last_expected_makespan = float(makespan)
        return capped

    def _native_kernel(self, name: str = "controller_budgets"):
        """The native kernel ``name`` (``controller_budgets`` / ``controller_cut``) when the config's backend allows
        it and the core is built, else ``None`` (numpy). ``step_token_cap > 0`` always runs in numpy (the kernels have
        no step cap). Resolved once per controller and name (the import and the availability check are not per
        step); ``backend="native"`` without the core raises ``ImportError`` at every call instead (nothing cached)."""
        kernel = self._kernels.get(name, _UNSET)
        if kernel is not _UNSET:
            return kernel
        cfg = self.config
        if cfg.backend == "python" or cfg.step_token_cap > 0:
            kernel = None
        else:
            from das_trl.drafter import native

            if cfg.backend == "native":
                kernel = getattr(native.load(), name)
            else:
                kernel = getattr(native.load(), name, None) if native.available() else None
        self._kernels[name] = kernel
        return kernel

    # ------------------------------------------------------------------ diagnostics
    def reset_counters(self) -> None:
        """Zero the cumulative counters of :meth:`stats` (lengths, cost fit and generator state are kept)."""
        self._counters = {k: (0.0 if isinstance(v, float) else 0) for k, v in self._counters.items()}

    #: Keys of :meth:`stats` that are cumulative counters (per-step differences are meaningful); the rest are gauges.
    COUNTERS = ("steps", "rows", "rows_drafting", "offered_tokens", "kept_tokens", "expected_accepted", "tail_rows",
                "capped_steps", "rows_speculated", "silent_steps", "replans", "quiet_steps")

    def stats(self) -> dict:
        """Flat, JSON-serializable diagnostics (callers prefix them, e.g. ``budget_``).

        Counters (cumulative; :attr:`COUNTERS`): ``steps``, ``rows`` (request-rounds), ``rows_drafting`` (rows
        given a budget > 0), ``offered_tokens`` (draft tokens the drafter produced), ``kept_tokens`` (tokens kept
        for verification), ``expected_accepted`` (their summed acceptance estimates), ``tail_rows`` (rows with a
        tail probability >= 0.5), ``capped_steps`` (steps cut by ``step_token_cap``), ``rows_speculated`` (rows the
        plan drafted), ``silent_steps`` (steps it drafted none), ``replans`` (tail probabilities recomputed),
        ``quiet_steps`` (silent steps that skipped the plan: :meth:`quiet_step`). Gauges: ``replan_interval``
        (engine steps between tail recomputations now: ``replan_steps``, or longer while consecutive recomputations
        drafted nothing, see ``quiet_replan_max_steps``), ``c_base_ms`` /
        ``c_tok_ms`` (the cost model in use), ``cost_online`` (1 when it is the online fit), ``fit_steps``,
        ``fit_c_base_ms`` / ``fit_c_tok_ms`` / ``fit_r2`` (the online fit, nan until computable),
        ``expected_makespan_rounds`` (last step), ``problems`` (with lengths)."""
        cost = self.cost
        fit = self.fit.stats()
        out: dict = dict(self._counters)
        out.update(c_base_ms=cost.c_base_ms, c_tok_ms=cost.c_tok_ms,
                   cost_online=int(cost is not self._config_cost), fit_steps=fit["steps"],
                   fit_c_base_ms=_finite(fit["c_base_ms"]), fit_c_tok_ms=_finite(fit["c_tok_ms"]),
                   fit_r2=_finite(fit["r2"]), expected_makespan_rounds=self.last_expected_makespan,
                   acceptance_ratio=self.acceptance_ratio, replan_interval=self._replan_interval,
                   problems=len(self.lengths))
        return out


def _finite(x: float) -> float | None:
    """``x``, or ``None`` when it is not finite (JSON has no nan)."""
    return float(x) if math.isfinite(x) else None
