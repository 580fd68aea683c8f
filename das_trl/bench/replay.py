"""Replay benchmark: draft a recorded later epoch given the earlier ones, verification round by round.

Input: rollouts in the JSONL format of :mod:`das_trl.drafter.rollout_log` (the trainer's ``das_record_rollouts``
or :mod:`das_trl.bench.record`). Epoch index = a problem's k-th appearance (``--group-by appearance``, default)
or ``floor(record.epoch)``; by default every epoch but the last is history and the last is replayed.

Simulation (hardware-independent; no model runs): the eval epoch's requests all start together and run as a
continuous batch. Each engine step, every running request gets a draft from the drafter (budget: the drafter's
own, or the :class:`~das_trl.budget.tiers.LengthPolicy`), the draft is accepted up to its first mismatch with the
recorded completion, and the request emits accepted + 1 tokens (never past its recorded end). Running siblings see
each other's outputs as of the previous step (DASDrafter's sibling visibility; arctic's active responses). A step
costs ``t_fwd = c_base + c_tok * tokens_in_pass`` (ms; tokens = running requests + their draft tokens); the batch
drains as requests finish. Warm-up (default; ``--no-warmup`` turns it off): each drafter first serves the last
history epoch the same way, which then becomes history, as in a live run; only the replayed epoch is measured.

Drafters: ``none``; ``ngram`` (vLLM's prompt lookup: longest suffix n-gram in [min, max] of prompt + output,
earliest occurrence, k tokens after it); ``suffix`` (vLLM 0.32's ``suffix`` method as shipped: arctic-inference
``SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)``, num_speculative_tokens 24,
max_spec_factor 1.0, min_token_prob 0.1; earlier epochs' responses are fed in as cached requests); DAS ablations
``das-problem`` (per-problem tree only), ``das+global`` (+ global and local trees), ``das+siblings`` (+ running
siblings), ``das+policy`` (+ length policy, tiers mode), ``das+cost`` (+ length policy, cost mode).

Metrics per drafter: tokens per verification round (emitted tokens / request-rounds), verification (draft)
tokens per accepted draft token, forward passes per request (mean), tail forward passes (the most any request
needed = the step count of the batch), and the simulated rollout time (ms).

CLI::

    python -m das_trl.bench.replay --rollouts FILE [--train-epochs 0,1,2] [--eval-epoch 3]
        [--drafters none,ngram,suffix,das+policy] [--json OUT] [--plots DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from das_trl.drafter.factory import create_drafter
from das_trl.drafter import DrafterConfig as _DrafterConfig
from das_trl.budget.controller import BudgetController, ControllerConfig
from das_trl.budget.tiers import LengthPolicy, LengthPolicyConfig
from das_trl.drafter.rollout_log import RolloutRecord, read_records

ALL_DRAFTERS = ("none", "ngram", "suffix", "das-problem", "das+global", "das+siblings", "das+policy", "das+cost",
                "das+controller")
DEFAULT_DRAFTERS = ALL_DRAFTERS

# vLLM 0.32 defaults (vllm/config/speculative.py): suffix_decoding_max_tree_depth=24, max_cached_requests=10000,
# max_spec_factor=1.0, min_token_prob=0.1; num_speculative_tokens defaults to max_tree_depth.
SUFFIX_DEFAULTS = dict(max_tree_depth=24, max_cached_requests=10000, max_spec_factor=1.0, min_token_prob=0.1,
                       num_speculative_tokens=24)


# ---------------------------------------------------------------------------- drafters
class Drafter:
    """Replay-side drafter interface.

    Each engine step the replay calls :meth:`draft_step` once for all running requests; the default implementation
    asks :meth:`budgets` for per-request budgets and then :meth:`propose` per request. ``context_tail``: how many
    trailing context tokens :meth:`propose` needs (``None``: the whole prompt + output).
    """

    name = "base"
    context_tail: int | None = None

    def prepare(self, train_epochs: Sequence[list[RolloutRecord]]) -> None:
        """Load history epochs the drafter did not serve (oldest first)."""

    def end_step(self, records: list[RolloutRecord]) -> None:
        """The batch this drafter just served ends: its rollouts become history (as the trainer's push does)."""

    def start(self, rid: str, rec: RolloutRecord) -> None:
        pass

    def extend(self, rid: str, tokens: list[int]) -> None:
        pass

    def stop(self, rid: str) -> None:
        pass

    def budgets(self, running: list[tuple[str, RolloutRecord, int]]) -> list[int]:
        return [0] * len(running)

    def propose(self, rid: str, context: np.ndarray, budget: int) -> list[int]:
        return []

    def draft_step(self, running: list[tuple[str, RolloutRecord, int, int]],
                   contexts: list[np.ndarray]) -> list[list[int]]:
        """Drafts for one engine step. ``running``: ``(request id, record, tokens emitted so far, rounds so far)``
        per running request; ``contexts``: its prompt + output (the last ``context_tail`` tokens)."""
        budgets = self.budgets([(rid, rec, pos) for rid, rec, pos, _ in running])
        return [self.propose(rid, ctx, int(b)) if b > 0 else []
                for (rid, _, _, _), ctx, b in zip(running, contexts, budgets)]

    def feedback(self, rid: str, drafted: int, accepted: int) -> None:
        """Verification outcome of ``rid``'s draft this round: ``accepted`` of ``drafted`` tokens."""
        pass


class NoDrafter(Drafter):
    name = "none"


def prompt_lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM ``ngram`` proposal: longest n in [min_n, max_n] whose last-n-gram occurs earlier in ``tokens``; the k
    tokens after its earliest occurrence."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        if n <= 0:
            break
        pat = tokens[total - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)
        hits = np.nonzero((windows == pat).all(axis=1))[0]
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramDrafter(Drafter):
    def __init__(self, min_n: int = 5, max_n: int = 5, k: int = 8) -> None:
        self.name = "ngram"
        self.min_n, self.max_n, self.k = min_n, max_n, k

    def budgets(self, running):
        return [self.k] * len(running)

    def propose(self, rid, context, budget):
        return prompt_lookup(context, self.min_n, self.max_n, budget)


class SuffixDrafter(Drafter):
    """vLLM's ``suffix`` method as shipped (arctic-inference SuffixDecodingCache, vLLM 0.32 defaults)."""

    def __init__(self, **overrides) -> None:
        """Raises ``ImportError`` naming the ``reference`` extra when arctic-inference is missing."""
        from das_trl.drafter.reference.arctic import suffix_decoding_cache

        SuffixDecodingCache = suffix_decoding_cache()  # noqa: N806 - a class
        self.name = "suffix"
        self.p = dict(SUFFIX_DEFAULTS, **overrides)
        self.context_tail = self.p["max_tree_depth"]
        self.cache = SuffixDecodingCache(max_tree_depth=self.p["max_tree_depth"],
                                         max_cached_requests=self.p["max_cached_requests"])

    def prepare(self, train_epochs):
        for e, recs in enumerate(train_epochs):
            for i, r in enumerate(recs):
                rid = f"hist-{e}-{i}"
                self.cache.start_request(rid, np.asarray(r.prompt_ids, dtype=np.int32))
                if r.completion_ids:
                    self.cache.add_active_response(rid, r.completion_ids)
                self.cache.stop_request(rid)

    def end_step(self, records):
        pass  # served responses entered the global cache when their requests stopped (as in vLLM)

    def start(self, rid, rec):
        self.cache.start_request(rid, np.asarray(rec.prompt_ids, dtype=np.int32))

    def extend(self, rid, tokens):
        self.cache.add_active_response(rid, tokens)

    def stop(self, rid):
        self.cache.stop_request(rid)

    def budgets(self, running):
        return [self.p["num_speculative_tokens"]] * len(running)

    def propose(self, rid, context, budget):
        pattern = context[-self.p["max_tree_depth"]:]
        draft = self.cache.speculate(rid, pattern, max_spec_tokens=budget, max_spec_factor=self.p["max_spec_factor"],
                                     min_token_prob=self.p["min_token_prob"])
        return list(draft.token_ids)


class DASReplayDrafter(Drafter):
    """The DAS drafter (``create_drafter``: the native core unless ``backend="python"``) fed one ``add_rollouts`` per
    history epoch (one appearance per problem), optional length policy.

    Driven as the engine's proposer drives it: one ``step`` call per engine step for all running requests, which
    reports the previous drafts' verification (accepted = tokens gained - 1), appends the tokens gained (read in
    place from a token matrix, as from vLLM's ``token_ids_cpu``) and drafts. Each request's matrix row holds its
    prompt and whole recorded completion; ``num_tokens`` says how much of it has been generated."""

    def __init__(self, name: str, config: _DrafterConfig, policy: LengthPolicy | None = None,
                 fixed_budget: int = 16) -> None:
        self.name = name
        self.d = create_drafter(config)
        self.policy = policy
        self.fixed_budget = fixed_budget
        self.context_tail = 0  # the drafter holds every request's text: no context copies
        self._texts: list[np.ndarray] = []
        self._row: dict[str, int] = {}
        self._prompt_len: dict[str, int] = {}
        self._gained: dict[str, int] = {}
        self._pos: dict[str, int] = {}
        self._matrix: np.ndarray | None = None

    def prepare(self, train_epochs):
        for recs in train_epochs:
            self.end_step(recs)

    def end_step(self, records):
        self.d.add_rollouts([r.prompt_ids for r in records], [r.completion_ids for r in records],
                            problem_keys=[r.problem_key for r in records])
        self._texts, self._row, self._matrix = [], {}, None
        if self.policy is not None:
            lens: dict[int, list[int]] = defaultdict(list)
            for r in records:
                lens[r.problem_key].append(len(r.completion_ids))
            for key, ls in lens.items():
                self.policy.observe(key, ls)
            self.policy.new_step()

    def start(self, rid, rec):
        self.d.start_request(rid, rec.prompt_ids, problem_key=rec.problem_key)
        self._row[rid] = len(self._texts)
        self._texts.append(np.concatenate([np.asarray(rec.prompt_ids, np.int32),
                                           np.asarray(rec.completion_ids, np.int32)]))
        self._prompt_len[rid] = len(rec.prompt_ids)
        self._gained[rid] = 0
        self._pos[rid] = 0
        self._matrix = None

    def extend(self, rid, tokens):
        self._gained[rid] = len(tokens)  # handed to the drafter by the next step call
        self._pos[rid] += len(tokens)

    def stop(self, rid):
        # The engine's proposer still sees a finishing request's last step (its tokens and verification) before it
        # leaves the batch: the same here, with no draft.
        if self._gained.get(rid):
            self._step([(rid, None, self._pos[rid], 0)], [0])
        self.d.stop_request(rid)
        self._gained.pop(rid, None)

    def budgets(self, running):
        if self.policy is None:
            return [self.fixed_budget] * len(running)
        return self.policy.budgets([(rec.problem_key, pos) for _, rec, pos in running], len(running))

    def propose(self, rid, context, budget):
        return self.d.propose(rid, context, budget)

    def _step(self, running, max_tokens):
        """One drafter ``step`` for the running requests with per-row budgets ``max_tokens``."""
        if self._matrix is None:  # all of a batch's requests start before its first step
            width = max(len(t) for t in self._texts)
            self._matrix = np.zeros((len(self._texts), width), np.int32)
            for i, t in enumerate(self._texts):
                self._matrix[i, : len(t)] = t
        n = len(running)
        rids = [rid for rid, _, _, _ in running]
        rows = np.fromiter((self._row[r] for r in rids), np.int64, n)
        num_prompt = np.fromiter((self._prompt_len[r] for r in rids), np.int64, n)
        num_tokens = num_prompt + np.fromiter((pos for _, _, pos, _ in running), np.int64, n)
        gained = np.fromiter((self._gained[r] for r in rids), np.int64, n)
        return rids, self.d.step(rids, self._matrix, rows, num_tokens, num_prompt, gained, np.full(n, -1),
                                 np.asarray(max_tokens, np.int64))

    def draft_step(self, running, contexts):
        _, batch = self._step(running, self.budgets([(rid, rec, pos) for rid, rec, pos, _ in running]))
        return batch.as_lists()

    def feedback(self, rid, drafted, accepted):
        # The drafter learns the outcome from the next step call (tokens gained); the policy learns it here.
        if self.policy is not None:
            self.policy.record_acceptance(drafted, accepted)


class DASControllerDrafter(DASReplayDrafter):
    """The DAS drafter + :class:`~das_trl.budget.controller.BudgetController`, as the live proposer runs them: each
    step drafts every running request up to the hard cap (``step``), the controller picks how many tokens of each
    draft to verify, the drafts are cut to that, and the drafter is told the cut length (``trim``)."""

    def __init__(self, name: str, config: _DrafterConfig, controller: ControllerConfig) -> None:
        super().__init__(name, config)
        self.controller = BudgetController(controller)
        self.max_output: int | None = None
        self._expected: dict[str, float] = {}  # request -> the controller's estimate for its kept draft

    def prepare(self, train_epochs):
        super().prepare(train_epochs)
        # A live engine knows each request's max_tokens; here it is the length of history rollouts cut by it.
        capped = [len(r.completion_ids) for recs in train_epochs for r in recs if r.finish_reason == "length"]
        self.max_output = max(capped) if capped else None

    def end_step(self, records):
        super().end_step(records)
        lens: dict[int, list[int]] = defaultdict(list)
        for r in records:
            lens[r.problem_key].append(len(r.completion_ids))
        for key, ls in lens.items():
            self.controller.observe(key, ls)

    def draft_step(self, running, contexts):
        n = len(running)
        rids, batch = self._step(running, np.full(n, self.d.config.max_spec_tokens))
        keys = np.fromiter((rec.problem_key for _, rec, _, _ in running), np.int64, n)
        out_len = np.fromiter((pos for _, _, pos, _ in running), np.int64, n)
        rounds = np.fromiter((r for _, _, _, r in running), np.int64, n)
        max_out = None if self.max_output is None else np.full(n, self.max_output)
        batch.truncate(self.controller.budgets(batch.accept, keys, out_len, rounds, max_out))
        self.d.trim(rids, batch.lengths)
        self._expected.update(zip(rids, self.controller.last_expected_kept.tolist()))
        return batch.as_lists()

    def feedback(self, rid, drafted, accepted):
        super().feedback(rid, drafted, accepted)
        expected = self._expected.pop(rid, 0.0)
        if drafted:
            self.controller.observe_acceptance(expected, accepted)


def make_drafter(name: str, ngram=(5, 5, 8), policy_config: LengthPolicyConfig | None = None,
                 das_overrides: dict | None = None, controller_config: ControllerConfig | None = None) -> Drafter:
    """Build a replay drafter by name (one of :data:`ALL_DRAFTERS`); ``das_overrides``: DrafterConfig fields applied
    to every DAS variant (the ablation switches of a variant still win); ``controller_config``: the
    ``das+controller`` variant's settings (give it the replay's cost model)."""
    ov = dict(das_overrides or {})

    def DrafterConfig(**kw):  # noqa: N802 - the variant's switches over the user's overrides
        return _DrafterConfig(**{**ov, **kw})

    if name == "none":
        return NoDrafter()
    if name == "ngram":
        return NgramDrafter(*ngram)
    if name == "suffix":
        return SuffixDrafter()
    pc = policy_config or LengthPolicyConfig()
    if name == "das-problem":
        return DASReplayDrafter(name, DrafterConfig(use_global_tree=False, use_local_tree=False,
                                                    share_running_siblings=False))
    if name == "das+global":
        return DASReplayDrafter(name, DrafterConfig(share_running_siblings=False))
    if name == "das+siblings":
        return DASReplayDrafter(name, DrafterConfig())
    if name == "das+policy":
        pc = LengthPolicyConfig(**{**pc.to_dict(), "mode": "tiers"})
        return DASReplayDrafter(name, DrafterConfig(max_spec_tokens=max(1, pc.max_budget)), LengthPolicy(pc))
    if name == "das+cost":
        pc = LengthPolicyConfig(**{**pc.to_dict(), "mode": "cost"})
        return DASReplayDrafter(name, DrafterConfig(max_spec_tokens=max(1, pc.max_budget)), LengthPolicy(pc))
    if name == "das+controller":
        return DASControllerDrafter(name, DrafterConfig(), controller_config or ControllerConfig(cost_source="config"))
    raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(ALL_DRAFTERS)}")


def controller_config(c_base: float, c_tok: float, overrides: dict | None = None) -> ControllerConfig:
    """The ``das+controller`` settings of a replay: the replay's own cost model (``cost_source="config"``; a replay
    has no step timings to fit) plus ``overrides`` (ControllerConfig fields)."""
    return ControllerConfig(**{**(overrides or {}), "cost_source": "config", "c_base_ms": c_base, "c_tok_ms": c_tok})


# ---------------------------------------------------------------------------- simulation
@dataclass
class ReplayResult:
    name: str
    requests: int
    tokens: int
    rounds: int                      # request-rounds (forward passes summed over requests)
    draft_tokens: int
    accepted_tokens: int
    steps: int                       # engine steps until the batch drained (= tail forward passes)
    sim_time_ms: float
    passes: list[int] = field(repr=False, default_factory=list)    # per request
    lengths: list[int] = field(repr=False, default_factory=list)   # per request
    batch_trace: list[tuple[float, int]] = field(repr=False, default_factory=list)  # (t_ms at step start, running)
    drafter_seconds: float = 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / max(1, self.rounds)

    @property
    def draft_per_accepted(self) -> float:
        return self.draft_tokens / self.accepted_tokens if self.accepted_tokens else math.nan

    def time_at(self, c_base: float, c_tok: float) -> float:
        """Cost-model time (ms) of the same replay under another cost model: every step costs ``c_base`` and every
        verified token (one per request-round plus the draft tokens) ``c_tok``. Exact for drafters whose drafts do
        not depend on the cost model (all but ``das+cost`` and ``das+controller``)."""
        return c_base * self.steps + c_tok * (self.rounds + self.draft_tokens)

    @property
    def mean_passes(self) -> float:
        return float(np.mean(self.passes)) if self.passes else 0.0

    def summary(self) -> dict:
        return {"drafter": self.name, "requests": self.requests, "tokens": self.tokens, "rounds": self.rounds,
                "tokens_per_round": self.tokens_per_round, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens, "draft_per_accepted": self.draft_per_accepted,
                "mean_passes": self.mean_passes, "tail_passes": self.steps, "sim_time_ms": self.sim_time_ms,
                "drafter_seconds": self.drafter_seconds}


def simulate(drafter: Drafter, train_epochs: Sequence[list[RolloutRecord]], eval_records: list[RolloutRecord],
             c_base: float = 7.0, c_tok: float = 0.025, warmup: bool = True) -> ReplayResult:
    """Replay ``eval_records`` as one continuous batch after feeding ``train_epochs`` to ``drafter``.

    With ``warmup`` (and at least 2 history epochs) the drafter first serves the last history epoch, replayed the
    same way from the epochs before it, and that epoch then enters its history through :meth:`Drafter.end_step`,
    as in a live run, where the engine drafted the previous step's rollouts before they were pushed. What a drafter
    learns from verification (DAS's acceptance calibration and the length policy's acceptance rate) is then as of
    the replayed epoch's start, not empty. Only the eval epoch is measured.
    """
    if warmup and len(train_epochs) >= 2:
        drafter.prepare(train_epochs[:-1])
        _replay_batch(drafter, train_epochs[-1], "warmup", c_base, c_tok)
        drafter.end_step(train_epochs[-1])
    else:
        drafter.prepare(train_epochs)
    return _replay_batch(drafter, eval_records, "eval", c_base, c_tok)


def _replay_batch(drafter: Drafter, eval_records: list[RolloutRecord], prefix: str, c_base: float,
                  c_tok: float) -> ReplayResult:
    n = len(eval_records)
    rids = [f"{prefix}-{i}" for i in range(n)]
    comps = [np.asarray(r.completion_ids, dtype=np.int64) for r in eval_records]
    ctx = [list(r.prompt_ids) for r in eval_records]
    pos = [0] * n
    passes = [0] * n
    running = [i for i in range(n) if len(comps[i]) > 0]
    for i in range(n):
        drafter.start(rids[i], eval_records[i])
    for i in range(n):
        if len(comps[i]) == 0:
            drafter.stop(rids[i])
    tokens = rounds = drafted_total = accepted_total = steps = 0
    t_ms = 0.0
    trace: list[tuple[float, int]] = []
    t_drafter = 0.0
    tail = drafter.context_tail
    while running:
        trace.append((t_ms, len(running)))
        # The engine does not know where a completion will end: drafts may run past it (those tokens are verified
        # and wasted, as in vLLM). The contexts are built outside the timed call: an engine holds them in place
        # (vLLM's token_ids_cpu), so copying them here is the replay's cost, not the drafter's.
        contexts = [np.asarray(ctx[i] if tail is None else ctx[i][-tail:] if tail else (), dtype=np.int32)
                    for i in running]
        step_rows = [(rids[i], eval_records[i], pos[i], passes[i]) for i in running]
        t0 = time.perf_counter()
        drafts = drafter.draft_step(step_rows, contexts)
        t_drafter += time.perf_counter() - t0
        step_tokens = 0
        still = []
        for i, draft in zip(running, drafts):
            comp, p = comps[i], pos[i]
            d = np.asarray(draft, dtype=np.int64)
            usable = min(len(d), len(comp) - p - 1)  # the last token is always the round's own (bonus) token
            mism = np.nonzero(d[:usable] != comp[p:p + usable])[0]
            acc = int(mism[0]) if mism.size else usable
            emit = comp[p:p + acc + 1].tolist()
            step_tokens += 1 + len(d)
            drafted_total += len(d)
            accepted_total += acc
            drafter.feedback(rids[i], len(d), acc)
            tokens += len(emit)
            rounds += 1
            passes[i] += 1
            pos[i] += len(emit)
            ctx[i].extend(emit)
            t0 = time.perf_counter()
            drafter.extend(rids[i], emit)
            if pos[i] >= len(comp):
                drafter.stop(rids[i])
            else:
                still.append(i)
            t_drafter += time.perf_counter() - t0
        t_ms += c_base + c_tok * step_tokens
        steps += 1
        running = still
    trace.append((t_ms, 0))
    return ReplayResult(drafter.name, n, tokens, rounds, drafted_total, accepted_total, steps, t_ms, passes,
                        [len(c) for c in comps], trace, t_drafter)


# ---------------------------------------------------------------------------- data
def load_epochs(path: str | Path, group_by: str = "appearance") -> dict[int, list[RolloutRecord]]:
    """Records grouped into epochs.

    ``group_by="appearance"`` (default): a record's epoch is the rank of its ``step`` among the steps in which its
    problem appears (a problem's k-th appearance is its epoch k), independent of how the trainer's fractional
    ``epoch`` is sampled (TRL reports it at the end of a step, e.g. 0.5 for the first of two steps per epoch).
    ``group_by="epoch"``: ``floor(epoch)`` (a tiny epsilon absorbs float noise).
    """
    records = list(read_records(path))
    out: dict[int, list[RolloutRecord]] = defaultdict(list)
    if group_by == "epoch":
        for r in records:
            out[int(math.floor(r.epoch + 1e-6))].append(r)
    elif group_by == "appearance":
        steps: dict[int, set[int]] = defaultdict(set)
        for r in records:
            steps[r.problem_key].add(r.step)
        rank = {key: {st: i for i, st in enumerate(sorted(v))} for key, v in steps.items()}
        for r in records:
            out[rank[r.problem_key][r.step]].append(r)
    else:
        raise ValueError(f"group_by must be 'appearance' or 'epoch', got {group_by!r}")
    return dict(sorted(out.items()))


def split_epochs(epochs: dict[int, list[RolloutRecord]], train: Sequence[int] | None, eval_epoch: int | None):
    keys = sorted(epochs)
    if len(keys) < 2 and train is None:
        raise ValueError(f"need at least 2 epochs to replay, found {keys}")
    ev = keys[-1] if eval_epoch is None else eval_epoch
    if ev not in epochs:
        raise ValueError(f"eval epoch {ev} not in the rollouts (epochs: {keys})")
    tr = [k for k in keys if k < ev] if train is None else list(train)
    for k in tr:
        if k not in epochs:
            raise ValueError(f"train epoch {k} not in the rollouts (epochs: {keys})")
    return [epochs[k] for k in tr], epochs[ev], tr, ev


def length_tiers(lengths: Sequence[int], long_fraction=0.2, medium_fraction=0.4) -> np.ndarray:
    """Tier per eval request by its own recorded length (0 short, 1 medium, 2 long; top 20% long, next 40%)."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    tiers = np.zeros(len(lengths), dtype=np.int64)
    nl = int(round(long_fraction * len(lengths)))
    nm = int(round(medium_fraction * len(lengths)))
    tiers[order[:nl]] = 2
    tiers[order[nl:nl + nm]] = 1
    return tiers


def tier_tokens_per_round(res: ReplayResult) -> dict[str, float]:
    tiers = length_tiers(res.lengths)
    out = {}
    for t, name in enumerate(("short", "medium", "long")):
        m = tiers == t
        p = np.asarray(res.passes)[m].sum()
        out[name] = float(np.asarray(res.lengths)[m].sum() / p) if p else math.nan
    return out


# ---------------------------------------------------------------------------- report
def format_table(results: Sequence[ReplayResult], baseline: str = "none", reference: str = "suffix") -> str:
    base = next((r for r in results if r.name == baseline), None)
    ref = next((r for r in results if r.name == reference), None)
    head = (f"{'drafter':<14}{'tok/round':>10}{'vs suffix':>10}{'draft/acc':>10}{'passes/req':>11}"
            f"{'tail':>7}{'tail/none':>10}{'sim ms':>10}{'speedup':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        vs = f"{r.tokens_per_round / ref.tokens_per_round:.2f}x" if ref else "-"
        dpa = f"{r.draft_per_accepted:.2f}" if not math.isnan(r.draft_per_accepted) else "-"
        tail = f"{r.steps / base.steps:.2f}" if base else "-"
        sp = f"{base.sim_time_ms / r.sim_time_ms:.2f}x" if base else "-"
        lines.append(f"{r.name:<14}{r.tokens_per_round:>10.3f}{vs:>10}{dpa:>10}{r.mean_passes:>11.1f}"
                     f"{r.steps:>7d}{tail:>10}{r.sim_time_ms:>10.0f}{sp:>9}")
    return "\n".join(lines)


def write_plots(results: Sequence[ReplayResult], outdir: str | Path, history_lengths: Sequence[int]) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    files = []
    lengths = results[0].lengths
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.linspace(0, max(max(lengths), max(history_lengths, default=1)) + 1, 40)
    ax.hist(history_lengths, bins=bins, alpha=0.5, label="history epochs", density=True)
    ax.hist(lengths, bins=bins, alpha=0.5, label="replayed epoch", density=True)
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("density")
    ax.legend()
    ax.set_title("Rollout length distribution")
    files.append(_save(fig, outdir / "length_distribution.png"))

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(results)
    for j, r in enumerate(results):
        tpr = tier_tokens_per_round(r)
        ax.bar(np.arange(3) + j * width, [tpr[k] for k in ("short", "medium", "long")], width, label=r.name)
    ax.set_xticks(np.arange(3) + 0.4 - width / 2, ["short (bottom 40%)", "medium", "long (top 20%)"])
    ax.set_ylabel("tokens per verification round")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Tokens per round by length tier")
    files.append(_save(fig, outdir / "tokens_per_round_by_tier.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        if r.name in ("none", "suffix", "das+policy", "das+cost", "das+controller") or r.name == results[-1].name:
            t, b = zip(*r.batch_trace)
            ax.step(np.asarray(t) / 1000.0, b, where="post", label=r.name)
    ax.set_xlabel("simulated time (s, cost model)")
    ax.set_ylabel("running requests")
    ax.legend()
    ax.set_title("Batch size over time")
    files.append(_save(fig, outdir / "batch_size_over_time.png"))
    return files


def _save(fig, path: Path) -> str:
    """Write a figure as PNG, close it, and return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das_trl.bench.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", required=True, help="JSONL rollouts (das_trl.drafter.rollout_log format)")
    p.add_argument("--train-epochs", default=None, help="comma-separated history epochs (default: all before eval)")
    p.add_argument("--eval-epoch", type=int, default=None, help="epoch to replay (default: the last)")
    p.add_argument("--group-by", choices=("appearance", "epoch"), default="appearance",
                   help="epoch = a problem's k-th appearance (default) or floor(record.epoch)")
    p.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS), help=f"from {','.join(ALL_DRAFTERS)}")
    p.add_argument("--c-base", type=float, default=7.0, help="cost model: ms per forward pass")
    p.add_argument("--c-tok", type=float, default=0.025, help="cost model: ms per token in a pass")
    p.add_argument("--ngram", default="5,5,8", help="prompt_lookup_min,prompt_lookup_max,num_speculative_tokens")
    p.add_argument("--policy", default=None, help="JSON of LengthPolicyConfig overrides, e.g. '{\"short_budget\": 0}'")
    p.add_argument("--controller", default=None,
                   help="JSON of ControllerConfig overrides for das+controller (its cost model is --c-base/--c-tok)")
    p.add_argument("--das-config", default=None,
                   help="JSON of DrafterConfig overrides for every DAS variant, e.g. '{\"max_spec_factor\": 1.0}'")
    p.add_argument("--no-warmup", action="store_true",
                   help="load every history epoch directly, without first serving the last one (drafters then start "
                        "the replayed epoch with nothing learned from verification)")
    p.add_argument("--json", default=None, help="write results to this JSON file")
    p.add_argument("--plots", default=None, help="write PNG plots into this directory")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    epochs = load_epochs(args.rollouts, args.group_by)
    train_ids = [int(x) for x in args.train_epochs.split(",")] if args.train_epochs else None
    train, evals, tr, ev = split_epochs(epochs, train_ids, args.eval_epoch)
    ngram = tuple(int(x) for x in args.ngram.split(","))
    pc = LengthPolicyConfig(**json.loads(args.policy)) if args.policy else LengthPolicyConfig()
    das_ov = json.loads(args.das_config) if args.das_config else {}
    cc = controller_config(args.c_base, args.c_tok, json.loads(args.controller) if args.controller else None)
    names = [x.strip() for x in args.drafters.split(",") if x.strip()]
    print(f"{args.rollouts}: history epochs {tr} ({sum(len(x) for x in train)} rollouts), replaying epoch {ev} "
          f"({len(evals)} rollouts, {len({r.problem_key for r in evals})} problems, "
          f"{sum(len(r.completion_ids) for r in evals)} tokens); cost model {args.c_base} ms + {args.c_tok} ms/token")
    results = []
    for name in names:
        res = simulate(make_drafter(name, ngram, pc, das_ov, cc), train, evals, args.c_base, args.c_tok,
                       warmup=not args.no_warmup)
        results.append(res)
    print(format_table(results))
    print("tokens/round by length tier (eval requests ranked by their own length):")
    for r in results:
        tpr = tier_tokens_per_round(r)
        print(f"  {r.name:<16}" + "  ".join(f"{k} {v:.3f}" for k, v in tpr.items()))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        payload = {"rollouts": str(args.rollouts), "train_epochs": tr, "eval_epoch": ev,
                   "c_base_ms": args.c_base, "c_tok_ms": args.c_tok, "ngram": list(ngram),
                   "warmup": not args.no_warmup and len(train) >= 2, "policy": pc.to_dict(),
                   "das_config_overrides": das_ov, "controller": cc.to_dict(), "suffix": SUFFIX_DEFAULTS,
                   "results": [dict(r.summary(), tiers=tier_tokens_per_round(r)) for r in results]}
        Path(args.json).write_text(json.dumps(payload, indent=2, default=float))
        print(f"wrote {args.json}")
    if args.plots:
        hist_lengths = [len(r.completion_ids) for recs in train for r in recs]
        for f in write_plots(results, args.plots, hist_lengths):
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
