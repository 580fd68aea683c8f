"""``das+controller``: the DAS drafter with the batch budget controller (:mod:`das_trl.budget.controller`), driven as
the live proposer drives them. The one place where the replay runs the controller."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from das_trl.budget.controller import BudgetController, ControllerConfig
from das_trl.drafter import DrafterConfig

from .das import DASReplayDrafter


class DASControllerDrafter(DASReplayDrafter):
    """The DAS drafter + :class:`~das_trl.budget.controller.BudgetController`, as the live proposer runs them: each
    step drafts every running request up to the hard cap (``step``), the controller picks how many tokens of each
    draft to verify, the drafts are cut to that, and the drafter is told the cut length (``trim``)."""

    def __init__(self, name: str, config: DrafterConfig, controller: ControllerConfig) -> None:
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
