"""The interface every replay drafter implements, and the no-speculation baseline (``none``).

The simulation (:mod:`das_trl.bench.simulation`) drives a drafter the way an engine's proposer is driven: history
before the batch (:meth:`Drafter.prepare`), the batch's arrays (:meth:`Drafter.begin`), each request's start, one
:meth:`Drafter.draft_step` per engine step for all running requests, what the scheduler cut of a draft
(:meth:`Drafter.scheduled`, replays with admission), the verification outcome per request
(:meth:`Drafter.feedback`), the tokens each request gained (:meth:`Drafter.extend`), its stop, the proposer's call
after the last forward pass (:meth:`Drafter.drain`), and the served batch becoming history (:meth:`Drafter.end_step`).

**Timing.** A drafter times exactly the calls the live proposer makes inside ``with self.watch:`` blocks (the
simulation's :class:`~das_trl.bench.simulation.Stopwatch`, read once per engine step); work that overlaps the
engine's forward pass goes to ``self.watch.add_background``. Replay glue (building the arrays an engine holds in
place) stays outside. The default :meth:`Drafter.draft_step` times :meth:`Drafter.budgets` and every
:meth:`Drafter.propose`; a drafter whose :meth:`extend` / :meth:`stop` call the engine-side drafter times them itself.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from das_trl.drafter.rollout_log import RolloutRecord


class _NullWatch:
    """A stopwatch that keeps nothing (a drafter used outside the simulation)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def add_background(self, seconds: float) -> None:
        pass


class Drafter:
    """Replay-side drafter interface.

    Each engine step the replay calls :meth:`draft_step` once for all running requests; the default implementation
    asks :meth:`budgets` for per-request budgets and then :meth:`propose` per request. ``context_tail``: how many
    trailing context tokens :meth:`propose` needs (``None``: the whole prompt + output).

    Class attributes the report reads: ``speculative`` (pays the async-scheduling charge: every method but
    ``none``), ``wall_timed`` (time the calls by the wall clock: several drafting threads), ``cpu_representative``
    (False where the replay's implementation is not the engine's, e.g. ``ngram``).
    """

    name = "base"
    context_tail: int | None = None
    speculative = True
    wall_timed = False
    cpu_representative = True
    watch = _NullWatch()

    @property
    def cpu_clock_name(self) -> str:
        return "wall" if self.wall_timed else "thread"

    def prepare(self, train_epochs: Sequence[list[RolloutRecord]]) -> None:
        """Load history epochs the drafter did not serve (oldest first)."""

    def end_step(self, records: list[RolloutRecord]) -> None:
        """The batch this drafter just served ends: its rollouts become history (as the trainer's push does)."""

    def begin(self, request_ids: list[str], records: list[RolloutRecord]) -> None:
        """A batch is about to start (every request before the first step): build what an engine holds in place
        (not timed)."""

    def engine_limits(self, token_budget: int | None, max_step_drafts: int | None = None,
                      max_draft_len: int | None = None) -> None:
        """The engine's limits before a replay (``None``: none): its token budget per step (vLLM's
        ``max_num_scheduled_tokens``), and the draft tokens one step and one row may verify (the profiled verification
        shape). A drafter that plans within them, as the proposer does, takes them here."""

    def start(self, rid: str, rec: RolloutRecord) -> None:
        pass

    def extend(self, rid: str, tokens: list[int]) -> None:
        pass

    def stop(self, rid: str) -> None:
        pass

    def drain(self) -> None:
        """The proposer's call after the batch's last forward pass (requests that finished in it)."""

    def budgets(self, running: list[tuple[str, RolloutRecord, int]]) -> list[int]:
        return [0] * len(running)

    def propose(self, rid: str, context: np.ndarray, budget: int) -> list[int]:
        return []

    def draft_step(self, running: list[tuple[str, RolloutRecord, int, int]],
                   contexts: list[np.ndarray]) -> list[list[int]]:
        """Drafts for one engine step. ``running``: ``(request id, record, tokens emitted so far, rounds so far)``
        per running request; ``contexts``: its prompt + output (the last ``context_tail`` tokens)."""
        with self.watch:
            budgets = self.budgets([(rid, rec, pos) for rid, rec, pos, _ in running])
            return [self.propose(rid, ctx, int(b)) if b > 0 else []
                    for (rid, _, _, _), ctx, b in zip(running, contexts, budgets)]

    def scheduled(self, rid: str, num_draft_tokens: int) -> None:
        """The engine's scheduler verifies only the first ``num_draft_tokens`` of ``rid``'s draft this step (the token
        budget went to waiting and prefilling requests first); the proposer learns it at its next call (vLLM's
        ``num_decode_draft_tokens``)."""

    def feedback(self, rid: str, drafted: int, accepted: int) -> None:
        """Verification outcome of ``rid``'s draft this round: ``accepted`` of ``drafted`` tokens."""
        pass

    def replay_counters(self) -> dict:
        """Drafter-specific counters of the last batch (JSON-serializable), kept in the result."""
        return {}

    def reliability_summary(self) -> dict:
        """The last batch's predicted vs realised acceptance per draft position and source
        (:meth:`das_trl.bench.reliability.ReliabilityRecord.to_dict`); empty for drafters without a budget
        controller."""
        return {}


class NoDrafter(Drafter):
    """No speculation: every round emits one token (the baseline of ``tail vs none`` and ``speedup``). The engine
    runs no proposer: nothing is timed, and it pays no async-scheduling charge."""

    name = "none"
    speculative = False

    @property
    def cpu_clock_name(self) -> str:
        return "none"

    def draft_step(self, running, contexts):
        return [[] for _ in running]
