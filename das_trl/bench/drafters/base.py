"""The interface every replay drafter implements, and the no-speculation baseline (``none``).

The simulation (:mod:`das_trl.bench.simulation`) drives a drafter the way an engine's proposer is driven: history
before the batch (:meth:`Drafter.prepare`), each request's start, one :meth:`Drafter.draft_step` per engine step for
all running requests, the verification outcome per request (:meth:`Drafter.feedback`), the tokens each request
gained (:meth:`Drafter.extend`), its stop, and the served batch becoming history (:meth:`Drafter.end_step`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from das_trl.drafter.rollout_log import RolloutRecord


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
    """No speculation: every round emits one token (the baseline of ``tail vs none`` and ``speedup``)."""

    name = "none"
