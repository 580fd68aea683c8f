"""The DAS replay variants without the controller: the drafter (``create_drafter``, the native core unless
``backend="python"``) with its own budget, or with the paper's length policy (``das+policy``: tiers,
``das+cost``: cost mode; :mod:`das_trl.budget.tiers`)."""

from __future__ import annotations

import time
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
    prompt and whole recorded completion; ``num_tokens`` says how much of it has been generated.

    Timed (:mod:`.base`): the drafter's ``start_request`` / ``step`` / ``stop_request`` / ``trim`` calls. In a step
    where no row drafts, the native core leaves the new tokens to its ingest thread (``background_ingest``); that
    work is completed right after the step and recorded as background (the ingest thread's CPU time plus any part
    this thread did), which the report charges only beyond the step's forward pass. With ``draft_threads`` > 1 the
    calls (and the ingest thread) are timed by the wall clock."""

    def __init__(self, name: str, config: DrafterConfig, policy: LengthPolicy | None = None,
                 fixed_budget: int = 16) -> None:
        self.name = name
        self.d = create_drafter(config)
        self.policy = policy
        self.fixed_budget = fixed_budget
        self.context_tail = 0  # the drafter holds every request's text: no context copies
        self.wall_timed = int(getattr(self.d.config, "draft_threads", 1)) > 1
        self._row: dict[str, int] = {}
        self._prompt_len: dict[str, int] = {}
        self._gained: dict[str, int] = {}
        self._pos: dict[str, int] = {}
        self._verified: dict[str, int] = {}  # draft tokens the scheduler kept, where it cut (the next step reports it)
        self._matrix = np.zeros((0, 0), np.int32)
        self._ingest_seen = self._ingest_seconds()

    def prepare(self, train_epochs):
        for recs in train_epochs:
            self.end_step(recs)

    def end_step(self, records):
        self.d.add_rollouts([r.prompt_ids for r in records], [r.completion_ids for r in records],
                            problem_keys=[r.problem_key for r in records])
        if self.policy is not None:
            lens: dict[int, list[int]] = defaultdict(list)
            for r in records:
                lens[r.problem_key].append(len(r.completion_ids))
            for key, ls in lens.items():
                self.policy.observe(key, ls)
            self.policy.new_step()

    def begin(self, request_ids, records):
        """The batch's token matrix (vLLM's ``token_ids_cpu``): row i = request i's prompt + whole completion."""
        texts = [np.concatenate([np.asarray(r.prompt_ids, np.int32), np.asarray(r.completion_ids, np.int32)])
                 for r in records]
        self._matrix = np.zeros((len(texts), max((len(t) for t in texts), default=0)), np.int32)
        for i, t in enumerate(texts):
            self._matrix[i, : len(t)] = t
        self._row = {rid: i for i, rid in enumerate(request_ids)}
        self._prompt_len = {rid: len(r.prompt_ids) for rid, r in zip(request_ids, records)}
        self._gained = dict.fromkeys(request_ids, 0)
        self._pos = dict.fromkeys(request_ids, 0)
        self._verified = {}
        self._ingest_seen = self._ingest_seconds()

    def start(self, rid, rec):
        with self.watch:
            self.d.start_request(rid, rec.prompt_ids, problem_key=rec.problem_key)

    def extend(self, rid, tokens):
        self._gained[rid] = len(tokens)  # handed to the drafter by the next step call
        self._pos[rid] += len(tokens)

    def stop(self, rid):
        # The engine's proposer still sees a finishing request's last step (its tokens and verification) before it
        # leaves the batch: the same here, with no draft.
        if self._gained.get(rid):
            self._step([(rid, None, self._pos[rid], 0)], [0])
        with self.watch:
            self.d.stop_request(rid)
        self._gained.pop(rid, None)

    def budgets(self, running):
        if self.policy is None:
            return [self.fixed_budget] * len(running)
        return self.policy.budgets([(rec.problem_key, pos) for _, rec, pos in running], len(running))

    def propose(self, rid, context, budget):
        return self.d.propose(rid, context, budget)

    def scheduled(self, rid, num_draft_tokens):
        self._verified[rid] = int(num_draft_tokens)

    def _arrays(self, rids: list[str], positions
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``rows, num_tokens, num_prompt, num_sampled, num_verified`` of these requests (what the engine holds; not
        timed; ``num_verified`` -1 where the whole draft was scheduled)."""
        n = len(rids)
        # int32, as vLLM holds them (token_ids_cpu, num_tokens_no_spec, num_prompt_tokens)
        rows = np.fromiter((self._row[r] for r in rids), np.int32, n)
        num_prompt = np.fromiter((self._prompt_len[r] for r in rids), np.int32, n)
        num_tokens = num_prompt + np.fromiter(positions, np.int32, n)
        gained = np.fromiter((self._gained[r] for r in rids), np.int32, n)
        verified = np.fromiter((self._verified.pop(r, -1) for r in rids), np.int32, n) if self._verified else \
            np.full(n, -1, np.int32)
        return rows, num_tokens, num_prompt, gained, verified

    def _step(self, running, max_tokens):
        """One drafter ``step`` for the running requests with per-row budgets ``max_tokens``."""
        rids = [rid for rid, _, _, _ in running]
        rows, num_tokens, num_prompt, gained, verified = self._arrays(rids, (pos for _, _, pos, _ in running))
        budgets = np.asarray(max_tokens, np.int64)
        with self.watch:
            out = self.d.step(rids, self._matrix, rows, num_tokens, num_prompt, gained, verified, budgets)
        self._collect_ingest()  # what the step deferred (all rows when none drafts; with defer_idle_rows, idle rows)
        return rids, out

    def _ingest_seconds(self) -> float | None:
        """The native core's ingest-thread time so far (``None``: a drafter without background ingest): its CPU
        time (``ingest_background_cpu_seconds``, like the thread-time clock of the calls), or its steady-clock time
        when the calls are timed by the wall clock or the core has no CPU figure."""
        if not getattr(self.d.config, "background_ingest", False) or not hasattr(self.d, "wait_for_ingest"):
            return None
        stats = self.d.stats()
        key = "ingest_background_cpu_seconds"
        if self.wall_timed or key not in stats:
            key = "ingest_background_seconds"
        return float(stats.get(key, 0.0))

    def _collect_ingest(self) -> None:
        """After a step that deferred its ingest (or part of it): complete it and record its time as background (the
        ingest thread's CPU time, plus any part this thread did because the thread had not started it)."""
        if self._ingest_seen is None:
            return
        clock = getattr(self.watch, "clock", time.thread_time)
        t0 = clock()
        self.d.wait_for_ingest()
        mine = clock() - t0
        now = self._ingest_seconds()
        self.watch.add_background(mine + now - self._ingest_seen)
        self._ingest_seen = now

    def draft_step(self, running, contexts):
        with self.watch:  # the length policy's budgets are the proposer's work too
            budgets = self.budgets([(rid, rec, pos) for rid, rec, pos, _ in running])
        _, batch = self._step(running, budgets)
        return batch.as_lists()

    def feedback(self, rid, drafted, accepted):
        # The drafter learns the outcome from the next step call (tokens gained); the policy learns it here.
        if self.policy is not None:
            self.policy.record_acceptance(drafted, accepted)
