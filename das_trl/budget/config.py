"""Settings of the batch budget controller (:class:`ControllerConfig`); what each one does: ``docs/budget.md``."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields

import numpy as np

from .cost_model import CostModel, assumed_c_logprob_ms

_COST_SOURCES = ("config", "online")
_DRAFT_ROW_SOURCES = ("config", "measured")
_BACKENDS = ("auto", "native", "python")


@dataclass
class ControllerConfig:
    """Settings of :class:`BudgetController` (times in ms, lengths in tokens). Validated on construction.

    Attributes:
        c_base_ms / c_tok_ms: the cost model ``c_base + c_tok * tokens`` per forward pass (paper Fig. 8: 7 / 0.025 on
            its GPUs; ``das-trl bench cost-profile`` measures it on the current device).
        c_logprob_ms / verification_shape: the verification logprob term of the cost model, ms per row of the
            logprob path (``None``: :func:`~das_trl.budget.cost_model.assumed_c_logprob_ms`, 1 us per row at a
            151,936-entry vocabulary, what an H200 measured with vLLM's compiled rank count (0.98 us), scaled to the
            engine's vocabulary by the proposer; ``recipes/gpu/verification_cost.py`` measures yours; 0: free),
            and that path's shape: ``"patched"`` (das-trl's patch: one row per verified position, so each draft token
            costs ``c_tok + c_logprob``) or ``"padded"`` (vLLM's own: ``rows x (longest draft + 1)``, so lengthening a
            step's longest draft costs ``c_logprob`` for every row of the batch, and the plan and the cut keep a long
            draft only where its expected saving pays for that: :func:`~das_trl.budget.step_cap.cap_longest_draft`).
            The vLLM proposer sets the shape from its engine (``verification_shape()``); the replay takes it as set.
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
            a row is drafted only where its expected saving also pays for this. The default (20) is what the draft
            search and the row's own ingest cost the proposer on a 2-core machine in the replays (all of its CPU over
            its drafted rows was 30-50 us on the large-batch sets; benchmarks/NOTES.md, "steps that draft little
            cost little"); a faster host or more ``draft_threads`` lower it. 0: drafting is free (the controller
            before this setting).
        draft_row_source: where the gate's price per drafted row comes from: ``"config"`` (``draft_row_us``: the
            same drafts on every run of the same rollouts) or ``"measured"`` (opt-in: the proposer's own CPU per
            drafted row on this host, fitted from its step times while it runs,
            :class:`~das_trl.budget.proposer_cost.ProposerCostFit`; ``draft_row_us`` until the fit answers).
            Measured times differ run to run, and so do the drafts.
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
            drawn around the row's observed one with this factor on its standard error
            (:func:`~das_trl.budget.remaining.tau_samples`); 0: the observed one exactly (the controller before this
            setting). :meth:`BudgetController.budgets` (the single-call API) does not use it.
        gate_send_rounds: the gate charges a row's proposer CPU divided by the chance that its draft survives the cut
            (``send`` of :meth:`BudgetController.plan`; the Speculator's request book estimates it per request with
            this many pseudo-steps at the engine-wide rate); 0: every speculated row counts as sending. With the
            tail uncertainty alone, AMC23 at c_tok 0.1 speculated rows whose drafts the cut then dropped (78 %) and
            lost more CPU than it saved; with both, the replay suite's mean time without CPU vs the best of none and
            suffix goes 0.946 -> 0.941 and the rows speculated on AMC23 fall 16-20 % (docs/tuning.md;
            benchmarks/NOTES.md, "Adopted: uncertain speeds, and the CPU of drafts the cut drops").
    """

    c_base_ms: float = 7.0
    c_tok_ms: float = 0.025
    c_logprob_ms: float | None = None
    verification_shape: str = "patched"
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
    draft_row_source: str = "config"
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
        CostModel(self.c_base_ms, self.c_tok_ms, self.logprob_ms, self.verification_shape)  # validates all four
        need(self.draft_row_source in _DRAFT_ROW_SOURCES, f"draft_row_source must be one of {_DRAFT_ROW_SOURCES}, "
                                                          f"got {self.draft_row_source!r}")
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

    @property
    def logprob_ms(self) -> float:
        """``c_logprob_ms``, or the assumed figure at a 151,936-entry vocabulary when it is ``None``."""
        return assumed_c_logprob_ms() if self.c_logprob_ms is None else self.c_logprob_ms

    def to_dict(self) -> dict:
        return asdict(self)
