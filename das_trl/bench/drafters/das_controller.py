"""``das+controller``: the product's default, driven exactly as the live proposer drives it.

The replay feeds :class:`das_trl.vllm.speculator.Speculator` (drafter + :class:`~das_trl.budget.BudgetController`:
plan, draft, cut), the object ``das_trl/vllm/proposer.py`` calls once per engine step, the way the proposer does:

* ``start(req_id, prompt, problem_key, max_output)`` when a request is first seen, its key resolved from its prompt
  as the proposer resolves a request without ``das_problem_id`` (:meth:`ConversationKeys.key_of`, the history's
  first prompts registered at each push) and timed with it (``max_output``: the longest history rollout cut by
  ``length``, the replay's estimate of the engine's ``max_tokens``; ``None`` without one);
* ONE ``step(req_ids, token_matrix, rows, num_tokens, num_prompt, num_sampled)`` per engine step for every request
  in the batch. The token matrix holds each request's prompt and whole recorded completion (vLLM's
  ``token_ids_cpu``); ``num_tokens`` says how much is generated. A request that emitted its last tokens is still in
  the next step (as in vLLM, where the proposer runs before the scheduler drops it); its draft is discarded; then
  ``finish`` at the step after (the proposer's "requests left" path). After the last forward pass the proposer runs
  once more for the last finishers (:meth:`drain`);
* history pushes: the drafter's ``add_rollouts`` plus the controller's ``observe`` per problem
  (``DASProposer.add_history``, with the Speculator's ``new_history``; built synchronously here, as a GRPO push is
  between generations).

Timed: ``start`` / ``step`` / ``finish`` (:mod:`.base`); the deferred ingest (every row of a step where nothing was
drafted, the rows without a budget of a drafting step) is background work, collected after each step
(:class:`~das_trl.bench.drafters.das.DASReplayDrafter`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from das_trl.bench.reliability import ReliabilityRecord
from das_trl.budget import BudgetController, ControllerConfig
from das_trl.drafter import DrafterConfig
from das_trl.drafter.conversation import ConversationKeys
from das_trl.vllm.speculator import Speculator

from .das import DASReplayDrafter

#: The controller's counters of the padded logprob shape a replay result carries (``budget_`` prefixed).
PADDING_COUNTERS = ("padding_cut_steps", "padding_ms", "padding_over_saving_steps")


class DASControllerDrafter(DASReplayDrafter):
    """The DAS drafter + batch budget controller inside a :class:`~das_trl.vllm.speculator.Speculator` (see the
    module docstring). ``speculator.counters`` are cumulative over every batch served (warm-up included);
    :meth:`replay_counters` and ``speculated_per_step`` / ``silent_per_step`` are the last batch's."""

    def __init__(self, name: str, config: DrafterConfig, controller: ControllerConfig) -> None:
        super().__init__(name, config)
        self.controller = BudgetController(controller)
        self.speculator = Speculator(self.d, self.controller, max_model_len=1)  # model length set per batch
        self.max_output: int | None = None
        self._longest = 0  # longest prompt + completion seen (the engine's model length must hold it)
        self._finishing: list[str] = []  # emitted their last tokens: in the next step, then finished
        self._finished: list[str] = []   # left the batch: finished at the next step, before it
        self._counters_at_begin: dict[str, int] = {}
        self._budget_at_begin: dict[str, float] = {}
        self.speculated_per_step: list[int] = []
        self.silent_per_step: list[int] = []
        self.reliability = ReliabilityRecord()  # the last batch's predicted vs realised acceptance
        self.conversations = ConversationKeys()  # DASProposer.conversations: first prompts -> problem keys

    def prepare(self, train_epochs):
        super().prepare(train_epochs)
        # A live engine knows each request's max_tokens; here it is the length of history rollouts cut by it.
        capped = [len(r.completion_ids) for recs in train_epochs for r in recs if r.finish_reason == "length"]
        self.max_output = max(capped) if capped else None

    def end_step(self, records):
        # DASProposer.add_history: the drafter's add_rollouts (via DASReplayDrafter), the controller's observe and
        # the Speculator's new_history.
        super().end_step(records)
        lens: dict[int, list[int]] = defaultdict(list)
        for r in records:
            if r.problem_key not in lens:  # the problem's first prompt, registered as add_history does
                self.conversations.register(np.asarray(r.prompt_ids, dtype=np.int64), r.problem_key)
            lens[r.problem_key].append(len(r.completion_ids))
        for key, ls in lens.items():
            self.controller.observe(key, ls)
        self.speculator.new_history()
        self._longest = max([self._longest] + [len(r.prompt_ids) + len(r.completion_ids) for r in records])

    def begin(self, request_ids, records):
        super().begin(request_ids, records)
        self._longest = max([self._longest] + [len(r.prompt_ids) + len(r.completion_ids) for r in records])
        # The engine's model length: room for every prompt + completion seen and a full draft after it.
        self.speculator.max_model_len = self._longest + self.d.config.max_spec_tokens + 1
        self._finishing, self._finished = [], []
        self._counters_at_begin = dict(self.speculator.counters)
        self._budget_at_begin = {k: self.controller.stats()[k] for k in PADDING_COUNTERS}
        self.speculated_per_step, self.silent_per_step = [], []
        self.reliability = ReliabilityRecord()

    def engine_limits(self, token_budget, max_step_drafts=None, max_draft_len=None):
        spec = self.speculator  # as DASProposer._speculator builds it
        spec.max_step_tokens, spec.max_step_drafts, spec.max_draft_len = token_budget, max_step_drafts, max_draft_len

    def start(self, rid, rec):
        # the prompt as DASProposer passes it: the request's int32 token row, prompt part (vLLM's token_ids_cpu)
        prompt = self._matrix[self._row[rid], : self._prompt_len[rid]]
        with self.watch:
            self.speculator.start(rid, prompt, self.conversations.key_of(prompt), self.max_output)

    def stop(self, rid):
        self._finishing.append(rid)  # seen once more by the next step (vLLM), then finished

    def _engine_step(self, running) -> tuple[list[str], object]:
        """One proposer call: finish the requests that left, then ``Speculator.step`` for the batch (the running
        requests and those that emitted their last tokens in the previous step)."""
        rids = [rid for rid, _, _, _ in running] + self._finishing
        positions = [pos for _, _, pos, _ in running] + [self._pos[r] for r in self._finishing]
        rows, num_tokens, num_prompt, gained, verified = self._arrays(rids, positions)
        gone, self._finished, self._finishing = self._finished, self._finishing, []
        spec = self.speculator
        before_rows, before_silent = spec.counters["speculated_rows"], spec.counters["silent_steps"]
        with self.watch:
            for rid in gone:
                spec.finish(rid)
            out = spec.step(rids, self._matrix, rows, num_tokens, num_prompt, gained, verified) if rids else None
        drafted = spec.counters["speculated_rows"] - before_rows
        self.speculated_per_step.append(drafted)
        self.silent_per_step.append(spec.counters["silent_steps"] - before_silent)
        if rids:  # a silent step defers every row, a drafting step its rows without a budget (defer_idle_rows)
            self._collect_ingest()
        return rids, out

    def draft_step(self, running, contexts):
        rids, out = self._engine_step(running)
        if out is not None:
            self._record_sent(rids, out)
        return [out.tokens[i, : out.lengths[i]].tolist() if out.lengths[i] else [] for i in range(len(running))]

    def drain(self):
        """The proposer's call after the last forward pass: the last finishers' step, then their finish."""
        if self._finishing:
            self._engine_step([])
        with self.watch:
            for rid in self._finished:
                self.speculator.finish(rid)
        self._finished = []

    def _record_sent(self, rids: list[str], out) -> None:
        """The estimates of every sent draft token, for :attr:`reliability` (after the timed call: diagnostics)."""
        plan = self.speculator.last_plan
        sent = out.lengths.nonzero()[0]
        if plan is None or not len(sent):
            return
        predicted = self.controller.predicted_acceptance(plan, out.accept[sent], sent)
        for j, i in enumerate(sent.tolist()):
            n = int(out.lengths[i])
            self.reliability.sent(rids[i], int(out.source[i]), predicted[j, :n], out.accept[i, :n])

    def feedback(self, rid, drafted, accepted):
        # The Speculator learns every outcome from the next step's tokens gained; the record is the replay's.
        self.reliability.verified(rid, drafted, accepted)

    def reliability_summary(self) -> dict:
        return self.reliability.to_dict()

    def replay_counters(self):
        now = self.speculator.counters
        out = {k: int(v - self._counters_at_begin.get(k, 0)) for k, v in now.items()}
        out["speculated_per_step"] = list(self.speculated_per_step)
        now_budget = self.controller.stats()
        for k in PADDING_COUNTERS:  # what the padded logprob shape cost and cut (the controller's counters)
            out[f"budget_{k}"] = now_budget[k] - self._budget_at_begin.get(k, 0)
        return out
