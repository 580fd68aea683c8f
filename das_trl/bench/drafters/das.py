"""The DAS replay variants without the controller: the drafter (``create_drafter``, the native core unless
``backend="python"``) with its own budget, or with the paper's length policy (``das+policy``: tiers,
``das+cost``: cost mode; :mod:`das_trl.budget.tiers`)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from das_trl.budget.tiers import LengthPolicy
from das_trl.drafter import DrafterConfig, create_drafter

from .base import Drafter


class DASReplayDrafter(Drafter):
    """The DAS drafter (``create_drafter``: the native core unless ``backend="python"``) fed one ``add_rollouts`` per
    history epoch (one appearance per problem), optional length policy.

    Driven as the engine's proposer drives it: one ``step`` call per engine step for all running requests, which
    reports the previous drafts' verification (accepted = tokens gained - 1), appends the tokens gained (read in
    place from a token matrix, as from vLLM's ``token_ids_cpu``) and drafts. Each request's matrix row holds its
    prompt and whole recorded completion; ``num_tokens`` says how much of it has been generated."""

    def __init__(self, name: str, config: DrafterConfig, policy: LengthPolicy | None = None,
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
