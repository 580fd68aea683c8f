"""The replay simulation: a recorded epoch replayed as one continuous batch, engine step by engine step.

Hardware-independent; no model runs. The eval epoch's requests all start together. Each engine step, every running
request gets a draft from the drafter (:mod:`das_trl.bench.drafters`), the draft is accepted up to its first mismatch
with the recorded completion, and the request emits accepted + 1 tokens (never past its recorded end). Running
siblings see each other's outputs as of the previous step (the drafter's sibling visibility; arctic's active
responses). A step costs ``t_fwd = c_base + c_tok * tokens_in_pass`` (ms; tokens = running requests + their draft
tokens); the batch drains as requests finish. Warm-up (:func:`simulate`'s ``warmup``): the drafter first serves the
last history epoch the same way, which then becomes history, as in a live run; only the replayed epoch is measured.

The drafter's own CPU time (:attr:`ReplayResult.drafter_seconds`) is measured around its calls; building the
contexts an engine would hold in place is not counted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from das_trl.bench.drafters import Drafter
from das_trl.drafter.rollout_log import RolloutRecord


@dataclass
class ReplayResult:
    """One drafter's replay of one batch. Counts are tokens, requests, rounds (one verification round = one request
    in one forward pass) and engine steps; ``sim_time_ms`` is the cost-model time (ms); ``drafter_seconds`` the
    drafter's own CPU time on this machine (s), the only figure that varies from run to run."""

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
