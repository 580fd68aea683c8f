"""The batch budget controller: how many of each request's draft tokens are worth verifying this engine step.

:meth:`BudgetController.plan` (before drafting: who can pay for a draft), :meth:`BudgetController.cut` (after: how much
of each draft to keep), :meth:`BudgetController.budgets` (both in one call). The decision is the pure functions of
``remaining.py``, ``tail.py``, ``gate.py``, ``draft_lengths.py`` and ``step_cap.py``; the model and its limits:
``docs/budget.md``. Arrays in, ``int32`` budgets out; numpy, the standard library and (optionally) the drafter's native
kernel (``das_trl/drafter/native/src/controller.cc``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import ControllerConfig
from .cost_model import CostModel, OnlineCostFit
from .draft_lengths import optimal_draft_lengths
from .gate import MAX_CAP, MIN_SEND, draft_caps, gate_rows
from .length_table import LengthTable
from .proposer_cost import ProposerCostFit
from .remaining import TAU_PSEUDO_ROUNDS, remaining_samples, stratified_draws, tau_quantiles, tau_samples
from .step_cap import apply_step_cap, cap_longest_draft
from .tail import survival, tail_probability

_UNSET = object()  # a native kernel not resolved yet
#: Padding (ms) below which a step of fewer than :data:`PADDING_CHECK_ROWS` rows is not checked against vLLM's padded
#: logprob path: the check (the survival of every kept position, then :func:`cap_longest_draft`) costs the proposer
#: ~0.05 ms per step on the engine's critical path (replays on a 2-core machine), so a padding that costs less cannot pay
#: for checking it. Steps of :data:`PADDING_CHECK_ROWS` rows or more, where the padding grows by a column of rows per
#: draft position, are always checked.
PADDING_CHECK_MS = 0.05
PADDING_CHECK_ROWS = 64


def padding_ms(lengths: np.ndarray, num_rows: int, cost: CostModel) -> float:
    """What vLLM's padded logprob path costs a step of ``num_rows`` rows beyond its verified positions, for these draft
    ``lengths`` (``int [m]``): ``c_logprob x (rows x longest - sum(lengths))``; 0 on the patched path."""
    if not cost.padded or not len(lengths):
        return 0.0
    return cost.c_logprob_ms * (num_rows * int(lengths.max()) - int(lengths.sum()))


def check_padding(lengths: np.ndarray, num_rows: int, cost: CostModel) -> bool:
    """Whether a step's drafts are checked against the padding (:data:`PADDING_CHECK_MS`, :data:`PADDING_CHECK_ROWS`)."""
    pad = padding_ms(lengths, num_rows, cost)
    return pad > PADDING_CHECK_MS or (pad > 0 and num_rows >= PADDING_CHECK_ROWS)


#: Request slots of :meth:`BudgetController.plan` lie below this (the per-slot tables: 16 bytes a slot, at most 64 MiB).
MAX_SLOTS = 1 << 22


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
        drafted: rows drafted (``draft``'s count; -1: not counted).
    """

    draft: np.ndarray
    weight_ms: np.ndarray
    problem_keys: np.ndarray
    generated: np.ndarray
    max_remaining: np.ndarray | None
    replanned: bool = False
    budget: np.ndarray | None = None
    drafted: int = -1


class BudgetController:
    """Per-step draft budgets for a batch (the model: ``docs/budget.md``).

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
        self._config_cost = CostModel(cfg.c_base_ms, cfg.c_tok_ms, cfg.logprob_ms, cfg.verification_shape)
        self._acc_expected = 0.0
        self._acc_accepted = 0.0
        self.last_expected_kept = np.zeros(0)
        self.last_tail_prob = np.zeros(0)
        self.last_expected_remaining = np.zeros(0)
        self.last_expected_makespan = 0.0
        self._counters = {"steps": 0, "rows": 0, "rows_drafting": 0, "offered_tokens": 0, "kept_tokens": 0,
                          "expected_accepted": 0.0, "tail_rows": 0, "capped_steps": 0, "rows_speculated": 0,
                          "silent_steps": 0, "replans": 0, "quiet_steps": 0, "padding_cut_steps": 0,
                          "padding_ms": 0.0, "padding_over_saving_steps": 0}
        self._last_silent = False  # the last plan drafted no row
        # plan(): tail probabilities kept per request slot between recomputations (grown by doubling).
        self._slot_p = np.zeros(0, np.float64)
        self._slot_epoch = np.full(0, -1, np.int64)
        self._epoch = 0
        self._rows_seen_epoch = -1  # the epoch at which the last plan / quiet_step saw every one of its rows
        self._rows_seen: np.ndarray | None = None  # ... and the slots array it saw them in
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
        self._measured_rows = cfg.draft_row_source == "measured"
        self.proposer_fit = ProposerCostFit()
        self._kernels: dict[str, object] = {}
        shared = {"draft_margin": cfg.draft_margin, "pooled_weight": cfg.pooled_weight,
                  "length_jitter": cfg.length_jitter, "extrapolation_fraction": cfg.extrapolation_fraction,
                  "min_remaining": float(cfg.min_remaining)}
        # "c_tok_ms" of the kernels is what a verified token costs in the decision: c_tok + c_logprob (its own row
        # of the verification logprob path; CostModel.token_ms)
        token_ms = self._config_cost.token_ms
        self._cut_params = {"ratio": 1.0, "c_tok_ms": token_ms, **shared}
        self._plan_params = {"tail_prior_weight": cfg.tail_prior_weight, "c_base_ms": cfg.c_base_ms,
                             "c_tok_ms": token_ms, "draft_row_ms": cfg.draft_row_us / 1000.0,
                             "tau_uncertainty": cfg.tau_uncertainty, **shared}
        # The stratified draws are the same for every row: the kernels take them once ([4, 1, S]), not per row.
        self._shared_draws = stratified_draws(1, cfg.num_samples)
        # plan(): one standard normal quantile per sample for the tokens-per-round uncertainty (empty: off).
        self._tau_z = tau_quantiles(cfg.num_samples) if cfg.tau_uncertainty > 0 else np.zeros(0)
        self._no_f64, self._no_i64 = np.zeros(0), np.zeros(0, np.int64)
        self._no_table = np.zeros((0, 1))
        self._budget_params = {"ratio": 1.0, "tail_prior_weight": cfg.tail_prior_weight, "c_base_ms": cfg.c_base_ms,
                               "c_tok_ms": token_ms, **shared}
        self._inf = np.full(0, np.inf)            # [>= n] inf (uncapped rows), sliced; never written
        self._ones = np.ones(0)                   # [>= n] 1.0 (tau_obs without num_rounds), sliced; never written
        self._scratch_f64 = np.empty((0, 0))      # [2, >= n] kernel outputs this class does not read

    # ------------------------------------------------------------------ inputs between steps
    def observe(self, problem_key: int, lengths) -> None:
        """Completion lengths (tokens) of one appearance of a problem (call on every history push)."""
        self.lengths.observe(problem_key, lengths)

    def history_pushed(self) -> None:
        """New history arrived: the next step recomputes its plan (the quiet backoff starts over), since what the
        drafter can offer changed. The pushed lengths are sorted into the length table here, during the push, not by
        the next step's plan (the same table either way)."""
        self.lengths.prepare()
        self._replan_interval = self.config.replan_steps
        self._silent_replans = 0
        self._since_plan = self._replan_interval  # due at the next step

    def observe_step(self, tokens: int, ms: float) -> None:
        """One engine step's tokens and duration (ms), for ``cost_source="online"``."""
        self.fit.add(tokens, ms)

    def observe_proposer(self, rows: int, drafted: int, seconds: float) -> None:
        """The proposer's CPU for one engine step (seconds of its thread) with ``rows`` rows, ``drafted`` of them
        drafted, for ``draft_row_source="measured"`` (:attr:`draft_row_us`)."""
        self.proposer_fit.add(rows, drafted, seconds)

    @property
    def draft_row_us(self) -> float:
        """The price per drafted row the gate charges now (microseconds): ``draft_row_us`` of the config, or with
        ``draft_row_source="measured"`` the proposer's measured CPU per drafted row once its fit answers."""
        if self._measured_rows:
            measured = self.proposer_fit.estimate_us()
            if measured is not None:
                return measured
        return self.config.draft_row_us

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
        config's. The fit times whole engine steps, so its ``c_tok`` already holds each verified position's logprob
        row: it gets the config's ``c_logprob_ms`` only where the path is padded (for the padding, which is not in
        proportion to the tokens; its per-position part is then counted twice, ~``c_logprob`` per token)."""
        if self._online:
            fitted = self.fit.estimate()
            if fitted is not None:
                cfg = self.config
                return CostModel(fitted.c_base_ms, fitted.c_tok_ms,
                                 cfg.logprob_ms if self._config_cost.padded else 0.0, cfg.verification_shape)
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
             send: np.ndarray | None = None, *, same_rows: bool = False, _prechecked: bool = False) -> StepPlan:
        """Decide, before drafting, which rows of this engine step are worth drafting at all.

        The tail probability ``P_i`` (who finishes last; ``docs/budget.md``) is computed from deterministic stratified
        samples and, with ``slots``, kept per request between recomputations (``replan_steps``, backed off up to
        ``quiet_replan_max_steps`` while recomputations draft nothing; ``replan_shrink``; ``always_plan_rows``). A
        row is drafted when even its predicted acceptance can pay for its verification and for the proposer's CPU
        (``draft_row_us``, divided by the row's chance of sending a draft at all) (:func:`gate_rows`); the rest are
        not drafted, so a step where nothing pays costs the proposer almost nothing. Each verified token costs
        ``c_tok + c_logprob`` (:attr:`CostModel.token_ms`); where the logprob path is padded
        (``verification_shape="padded"``) the drafted rows' lengths are also cut to the longest draft whose padding
        the batch can pay for (:meth:`_padding_budget`).

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
            same_rows: as for :meth:`quiet_step`: the caller's promise that ``slots`` (the same array object) holds
                the same requests as at its previous :meth:`plan` / :meth:`quiet_step`, so the check that the last
                computation saw every row is skipped when it passed since (O(rows) array work otherwise).
            _prechecked: private to the Speculator, whose request book gives every array ``n`` entries of
                :class:`~das_trl.vllm.request_book.PlanInputs`' dtypes and distinct slots ``>= 0`` below its number of
                requests: their conversion and validation are skipped (~10 us per engine step); the native kernel
                still checks every number (the numpy path, as without it).

        Returns:
            :class:`StepPlan`.

        Raises:
            ValueError: shapes disagree, a slot outside ``[0, MAX_SLOTS)``, fractional or (at a recomputation)
                repeated, an acceptance or send rate outside ``[0, 1]`` or NaN, or a negative / NaN output length,
                round count or max output (nothing changed).
        """
        cfg = self.config
        if _prechecked:  # the Speculator's book: int64 keys and rounds / max output, int32 lengths and caps, float64
            # rates, int64 distinct slots >= 0 (see the docstring)
            keys, caps_arr, q, snd, sl = problem_keys, caps, acceptance, send, slots
            n = len(keys)
            out_len = output_len.astype(np.float64)
            r = num_rounds.astype(np.float64)
            mo = max_output.astype(np.float64)
        else:
            keys, out_len, r, mo, caps_arr, q, snd, sl = self._plan_arrays(problem_keys, output_len, num_rounds,
                                                                           max_output, caps, acceptance, slots, send)
            n = len(keys)
        cost = self.cost if self._online else self._config_cost
        cap = None if mo is None else mo - out_len
        if n == 0:
            self._acc_expected *= cfg.acceptance_decay
            self._acc_accepted *= cfg.acceptance_decay
            return StepPlan(np.zeros(0, bool), np.zeros(0), keys, out_len, cap, budget=np.zeros(0, np.int32), drafted=0)
        if n > len(self._inf):
            self._grow(n)
        replan = sl is None or n <= cfg.always_plan_rows or self._since_plan + 1 >= self._replan_interval \
            or n < (1.0 - cfg.replan_shrink) * self._rows_at_plan
        # A request not seen at the last computation forces one (slot epochs never exceed the current epoch); rows the
        # last plan / quiet step saw, unchanged since (same_rows, the same array) and with no computation since, are.
        if sl is not None and not replan and not (same_rows and sl is self._rows_seen and
                                                  self._rows_seen_epoch == self._epoch):
            replan = not self._all_rows_seen(sl)
        if sl is not None and replan:
            top = int(np.maximum.reduce(sl))
            if not _prechecked:
                if top >= MAX_SLOTS:  # the stored probabilities are indexed by slot
                    raise ValueError(f"BudgetController.plan: slots must be below {MAX_SLOTS} (one per running "
                                     f"request), got {top}")
                # Two rows under one slot would overwrite each other's stored probability.
                if n > 1 and int(np.maximum.reduce(np.bincount(sl))) > 1:
                    raise ValueError(f"BudgetController.plan: slots must be distinct (one per running request), got "
                                     f"slot {int(np.bincount(sl).argmax())} more than once")
            if top >= len(self._slot_p):
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
                    tau_obs = out_len + TAU_PSEUDO_ROUNDS
                    tau_obs /= r + TAU_PSEUDO_ROUNDS
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
            row_ms = self.draft_row_us / 1000.0
            if snd is not None:  # the row's CPU per draft that survives the cut
                row_ms = row_ms / np.maximum(snd, MIN_SEND)
            qq = self._prior[:n] if q is None else q
            cc = self._caps16[:n] if caps_arr is None else caps_arr
            draft = gate_rows(weight, qq, cc, cost.token_ms, row_ms, cfg.draft_margin)
            budget = np.zeros(n, np.int32)
            rows = draft.nonzero()[0]  # the caps of the drafted rows only (in a large batch, few or none)
            drafted = len(rows)
            if drafted:
                budget[rows] = draft_caps(weight[rows], np.asarray(qq)[rows], np.asarray(cc)[rows], cost.token_ms,
                                          ratio, cfg.draft_margin)
            tails = int(np.count_nonzero(p >= 0.5))
        if drafted and cost.padded and check_padding(budget, n, cost):
            draft, budget, drafted = self._padding_budget(draft, budget, weight, q, cost, ratio)
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
        self._rows_seen = sl
        self.last_tail_prob = p
        return StepPlan(draft, weight, keys, out_len, cap, replan, budget, drafted)

    @staticmethod
    def _plan_arrays(problem_keys, output_len, num_rounds, max_output, caps, acceptance, slots, send) -> tuple:
        """:meth:`plan`'s inputs converted once (no copy where an array has the dtype already) and checked: ``(keys
        int64, out_len / rounds / max_output float64, caps any integer dtype (gate_rows compares it exactly),
        acceptance / send float64, slots int64)``, the optional ones ``None`` when not given.

        Raises:
            ValueError: shapes disagree, fractional or negative slots (nothing changed).
        """
        keys = np.asarray(problem_keys, dtype=np.int64)
        if keys.ndim != 1:
            keys = keys.reshape(-1)
        n = len(keys)
        out_len = np.asarray(output_len, dtype=np.float64)
        if out_len.ndim != 1:
            out_len = out_len.reshape(-1)
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
        if sl is not None and n and int(np.minimum.reduce(sl)) < 0:
            raise ValueError(f"BudgetController.plan: slots must be >= 0, got {int(sl.min())}")
        return keys, out_len, r, mo, caps_arr, q, snd, sl

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
            params["c_base_ms"], params["c_tok_ms"] = cost.c_base_ms, cost.token_ms
        if self._measured_rows:
            params["draft_row_ms"] = self.draft_row_us / 1000.0
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
                :meth:`plan` or :meth:`quiet_step` (the Speculator knows it from the request ids): then, when that call
                was given the same array object and no recomputation happened since, the check that the last plan saw
                every row is skipped (it passed already; O(rows) array work otherwise).
        """
        cfg = self.config
        n = len(slots)
        if not self._last_silent or n <= cfg.always_plan_rows or self._since_plan + 1 >= self._replan_interval \
                or n < (1.0 - cfg.replan_shrink) * self._rows_at_plan or self._online:
            return False
        # A request the last computation did not see (slot epochs never exceed the current epoch).
        if not (same_rows and slots is self._rows_seen and self._rows_seen_epoch == self._epoch):
            if not self._all_rows_seen(slots):
                return False
            self._rows_seen_epoch = self._epoch
            self._rows_seen = slots
        self._since_plan += 1
        self._acc_expected *= cfg.acceptance_decay
        self._acc_accepted *= cfg.acceptance_decay
        c = self._counters
        c["steps"] += 1
        c["rows"] += n
        c["silent_steps"] += 1
        c["quiet_steps"] += 1
        return True

    def _all_rows_seen(self, slots: np.ndarray) -> bool:
        """Whether every row of ``slots`` (``int64 [n]``, n >= 1, each >= 0) is a request the computation of the
        current epoch saw (slot epochs never exceed it): the native ``controller_rows_seen`` in one pass (numpy's
        three calls cost ~5-12 us per engine step at 150-550 rows, dispatched cold between the engine's other work),
        else numpy, its reference."""
        kernel = self._kernels.get("controller_rows_seen", _UNSET)
        if kernel is _UNSET:
            kernel = self._native_kernel("controller_rows_seen")
        if kernel is not None:
            return kernel(slots, self._slot_epoch, self._epoch)
        return not (int(np.maximum.reduce(slots)) >= len(self._slot_epoch)
                    or int(np.minimum.reduce(self._slot_epoch[slots])) < self._epoch)

    def cut(self, plan: StepPlan, accept: np.ndarray, rows: np.ndarray | None = None, *,
            _prechecked: bool = False) -> np.ndarray:
        """Draft tokens to keep per drafted row (after drafting): the length that minimises the cost per token of
        progress (:func:`optimal_draft_lengths`) under the plan's ``weight_ms``, with each estimate scaled by the
        chance the position lies before the request's end (:func:`survival`, same deterministic samples) and by
        :attr:`acceptance_ratio`. Where the logprob path is padded, the kept lengths are then cut to the longest draft
        that pays for its padding over the plan's whole batch (:func:`cap_longest_draft`). Sets
        :attr:`last_expected_kept` for these rows.

        Args:
            plan: this step's :meth:`plan`.
            accept: ``float64 [m, K]`` cumulative acceptance estimates of the drafted rows (``DraftBatch.accept``).
            rows: ``int [m]`` the drafted rows' indices in the plan (``None``: every row, ``m = n``).
            _prechecked: private to the Speculator, whose ``accept`` is a C-contiguous ``float64 [m, K]`` and ``rows``
                the ``int64 [m]`` indices of its drafted rows (``np.nonzero``: in range): their conversion and range
                check are skipped (the estimates are still checked).

        Returns:
            ``int32 [m]``, ``0 <= kept[i] <=`` the row's draft length.

        Raises:
            ValueError: shapes disagree, ``rows`` outside the plan, or ``accept`` outside ``[0, 1]`` or NaN (nothing
                counted).
        """
        if _prechecked:
            idx = rows
        else:
            accept = np.asarray(accept, dtype=np.float64)
            if rows is None:
                idx = np.arange(len(plan.draft))
            else:
                idx = np.asarray(rows, dtype=np.int64)
                if idx.ndim != 1:
                    idx = idx.reshape(-1)
            if accept.ndim != 2 or len(accept) != len(idx):
                raise ValueError(f"BudgetController.cut: accept must be [{len(idx)}, K] (one row per drafted row), "
                                 f"got shape {accept.shape}")
        m, k = accept.shape
        if m == 0:
            self.last_expected_kept = np.zeros(0)
            return np.zeros(0, np.int32)
        if not _prechecked and (int(np.minimum.reduce(idx)) < 0 or int(np.maximum.reduce(idx)) >= len(plan.draft)):
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
            params["c_tok_ms"] = cost.token_ms
            if m > len(self._inf):
                self._grow(m)
            kept_tokens, drafting, offered, expected = kernel(
                np.ascontiguousarray(accept), table, pooled, idx, plan.generated,
                self._no_f64 if plan.max_remaining is None else plan.max_remaining, self._shared_draws,
                plan.weight_ms, params, capped, self._scratch_f64[0, :m], kept)
            if kept_tokens and cost.padded and check_padding(capped, len(plan.draft), cost):
                survival_k = self._survival(plan, idx, k)
                shorter = self._cut_padding(np.minimum(accept * survival_k * ratio, 1.0), capped,
                                            self._scratch_f64[0, :m], cost, len(plan.draft))
                if shorter is not capped:
                    capped = shorter
                    kept = np.where(np.arange(k)[None, :] < capped[:, None], accept * survival_k, 0.0).sum(axis=1)
                    kept_tokens, drafting = int(capped.sum()), int(np.count_nonzero(capped))
                    expected = float(kept.sum())
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
        lengths, value = optimal_draft_lengths(useful, weight, cost.token_ms, cfg.draft_margin)
        capped = apply_step_cap(useful, lengths, value, cost.token_ms, cfg.step_token_cap)
        c["capped_steps"] += int(int(np.add.reduce(capped)) < int(np.add.reduce(lengths)))
        if check_padding(capped, len(plan.draft), cost):
            capped = self._cut_padding(useful, capped, value, cost, len(plan.draft))
        kept = np.where(np.arange(k)[None, :] < capped[:, None], accept * survival_k, 0.0).sum(axis=1)
        kept_tokens = int(np.add.reduce(capped))
        c["rows_drafting"] += int(np.count_nonzero(capped))  # kept lengths are >= 0
        c["offered_tokens"] += int(np.count_nonzero(accept > 0))
        c["kept_tokens"] += kept_tokens
        c["expected_accepted"] += float(np.add.reduce(kept))
        self.last_expected_kept = kept
        return capped

    def _cut_padding(self, useful: np.ndarray, capped: np.ndarray, value: np.ndarray, cost: CostModel,
                     num_rows: int) -> np.ndarray:
        """(Where :func:`check_padding` says so.) The cut's kept lengths cut to the longest
        draft that pays for vLLM's padded logprob path
        (:func:`cap_longest_draft`; ``capped`` itself when nothing is cut), and the padding's price against the kept
        drafts' expected saving counted (``padding_ms``, ``padding_over_saving_steps``: the saving is the kept
        positions' ``max(useful x value - token_ms, 0)``, as the cap counts it, the padding ``c_logprob x (rows x
        longest - kept tokens)``)."""
        shorter = cap_longest_draft(useful, capped, value, cost.token_ms, cost.c_logprob_ms, num_rows)
        c = self._counters
        c["padding_cut_steps"] += int(shorter is not capped)
        longest = int(shorter.max(initial=0))
        if longest:
            padding = cost.c_logprob_ms * (num_rows * longest - int(shorter.sum()))
            kept = np.arange(useful.shape[1])[None, :] < shorter[:, None]
            saving = float(np.where(kept, np.maximum(useful * value[:, None] - cost.token_ms, 0.0), 0.0).sum())
            c["padding_ms"] += padding
            c["padding_over_saving_steps"] += int(padding > saving + 1e-12)
        return shorter

    def _padding_budget(self, draft: np.ndarray, budget: np.ndarray, weight: np.ndarray, q: np.ndarray | None,
                        cost: CostModel, ratio: float) -> tuple[np.ndarray, np.ndarray, int]:
        """The plan's draft lengths cut, before drafting, to the longest draft that can pay for vLLM's padded logprob
        path (:func:`cap_longest_draft`) on optimistic estimates, so the cut after drafting rarely wants more than
        was drafted: position ``j`` of row ``i`` accepted with ``min(max(ratio, 1) q_i^((j + 1) / 2), 1)`` (drafts
        vary around the row's average: :func:`draft_caps` allows twice the reach of ``q_i`` for the same reason),
        worth ``weight_i + token_ms`` a token (the most a token of progress is worth to the row) and its own
        verification not charged (whether it pays for that is :func:`draft_caps`' and the cut's decision): only a
        column of padding that outweighs every saving the column could bring is cut. Returns ``(draft, budget, rows
        drafted)``; rows cut to 0 are not drafted."""
        rows = budget.nonzero()[0]
        qi = np.clip(self._prior[rows] if q is None else q[rows], 0.0, 0.999)
        k = int(budget[rows].max())
        useful = np.minimum(max(ratio, 1.0) * qi[:, None] ** (np.arange(1, k + 1)[None, :] / 2.0), 1.0)
        capped = cap_longest_draft(useful, budget[rows], weight[rows] + cost.token_ms, 0.0, cost.c_logprob_ms,
                                   len(budget))
        if capped is budget[rows] or np.array_equal(capped, budget[rows]):
            return draft, budget, len(rows)
        budget = budget.copy()
        budget[rows] = capped
        draft = draft & (budget > 0)
        return draft, budget, int(np.count_nonzero(draft))

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
            tau_obs = np.maximum(1.0, (out_len + TAU_PSEUDO_ROUNDS) / (r + TAU_PSEUDO_ROUNDS))
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
            params["c_tok_ms"] = cost.token_ms
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
            lengths, value = optimal_draft_lengths(useful, cost.c_base_ms * p, cost.token_ms, cfg.draft_margin)
            capped = apply_step_cap(useful, lengths, value, cost.token_ms, cfg.step_token_cap)
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

    @property
    def backend_in_use(self) -> str:
        """Where this controller's kernels run: ``"native"`` (the drafter's core) or ``"numpy"`` (the reference),
        resolved as every step resolves it (the config's ``backend``, ``step_token_cap`` and whether the core is
        built). ``backend="native"`` without the core raises ``ImportError`` here as at a step."""
        return "numpy" if self._native_kernel() is None else "native"

    def _native_kernel(self, name: str = "controller_budgets"):
        """The native kernel ``name`` (``controller_budgets``, ``controller_cut``, ...) when the config's backend
        allows it and the core is built, else ``None`` (numpy). ``step_token_cap > 0`` always runs in numpy (the
        kernels have no step cap). Resolved once per controller and name (the import and the availability check are
        not per step); ``backend="native"`` without the core raises ``ImportError`` at every call instead (nothing
        cached)."""
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
                "capped_steps", "rows_speculated", "silent_steps", "replans", "quiet_steps", "padding_cut_steps",
                "padding_ms", "padding_over_saving_steps")

    def stats(self) -> dict:
        """Flat, JSON-serializable diagnostics (callers prefix them, e.g. ``budget_``).

        Counters (cumulative; :attr:`COUNTERS`): ``steps``, ``rows`` (request-rounds), ``rows_drafting`` (rows
        given a budget > 0), ``offered_tokens`` (draft tokens the drafter produced), ``kept_tokens`` (tokens kept
        for verification), ``expected_accepted`` (their summed acceptance estimates), ``tail_rows`` (rows with a
        tail probability >= 0.5), ``capped_steps`` (steps cut by ``step_token_cap``), ``rows_speculated`` (rows the
        plan drafted), ``silent_steps`` (steps it drafted none), ``replans`` (tail probabilities recomputed),
        ``quiet_steps`` (silent steps that skipped the plan: :meth:`quiet_step`), ``padding_cut_steps`` (steps whose
        longest draft the cut shortened because vLLM's padded logprob path would cost more than it saves),
        ``padding_ms`` (the padding the kept drafts cost, padded shape) and ``padding_over_saving_steps`` (steps whose
        padding cost more than the kept drafts' expected saving: 0 unless the rule is broken). Gauges:
        ``replan_interval`` (engine steps between tail recomputations now: ``replan_steps``, or longer while
        consecutive recomputations drafted nothing, see ``quiet_replan_max_steps``), ``c_base_ms`` / ``c_tok_ms`` /
        ``c_logprob_ms`` (the cost model in use), ``cost_online`` (1 when it is the online fit), ``fit_steps``,
        ``fit_c_base_ms`` / ``fit_c_tok_ms`` / ``fit_r2`` (the online fit, nan until computable),
        ``expected_makespan_rounds`` (last step), ``problems`` (with lengths), ``draft_row_us`` (the gate's price
        per drafted row now) and ``fit_draft_row_us`` (the proposer's measured CPU per drafted row, nan until
        computable; the price only with ``draft_row_source="measured"``)."""
        cost = self.cost
        fit = self.fit.stats()
        out: dict = dict(self._counters)
        out.update(c_base_ms=cost.c_base_ms, c_tok_ms=cost.c_tok_ms, c_logprob_ms=cost.c_logprob_ms,
                   cost_online=int(cost is not self._config_cost), fit_steps=fit["steps"],
                   fit_c_base_ms=_finite(fit["c_base_ms"]), fit_c_tok_ms=_finite(fit["c_tok_ms"]),
                   fit_r2=_finite(fit["r2"]), expected_makespan_rounds=self.last_expected_makespan,
                   acceptance_ratio=self.acceptance_ratio, replan_interval=self._replan_interval,
                   draft_row_us=self.draft_row_us, fit_draft_row_us=_finite(self.proposer_fit.stats()["c_us"]),
                   problems=len(self.lengths))
        return out


def _finite(x: float) -> float | None:
    """``x``, or ``None`` when it is not finite (JSON has no nan)."""
    return float(x) if math.isfinite(x) else None
