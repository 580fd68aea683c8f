"""The scheduler a DAS engine runs: vLLM's own, except that draft tokens never take the step's token budget from a
request waiting for admission or still prefilling.

vLLM's V1 scheduler (``Scheduler.schedule`` in ``vllm/v1/core/sched/scheduler.py``, 0.32 and 0.33) serves the running
requests first, each with its draft tokens (``Request.spec_token_ids``), and admits waiting requests out of what is
left of one token budget (``max_num_scheduled_tokens``, which is ``max_num_batched_tokens`` unless set). Long drafts
can fill it: on the CPU engine (budget 128, 24 drafting rows) a burst of 24 short prompts got its first tokens by step
7 without speculation and by step 79 (K 8) and 115 (K 64) with DAS (``benchmarks/NOTES.md``, "Waiting requests
first").

:class:`DASScheduler` shortens the running requests' drafts before vLLM's ``schedule`` runs, so that the budget covers,
in this order: one token per decoding request and the prompt chunks of running requests still prefilling; the prompt
tokens of the waiting requests that vLLM could admit this step (a free request slot under ``max_num_seqs``, KV blocks
for the whole prompt, as vLLM's admission checks them); then drafts, far positions first (every draft cut to a common
length, :func:`~das_trl.budget.step_cap.cap_step_tokens`). The requests then get the tokens the engine without
speculation would give them. The tokens cut are never verified: the model runner records each row's scheduled draft
length (``num_decode_draft_tokens``), and the proposer and the drafter count only those as verified. It also turns
off vLLM's padding of one-token admissions to ``1 + K`` (:func:`~das_trl.vllm.admission_padding.unpad_admissions`).

Enabled with ``scheduler_cls="das_trl.vllm.scheduler.DASScheduler"`` (CLI ``--scheduler-cls``;
:data:`~das_trl.vllm.engine.SCHEDULER_QUALNAME`: :func:`~das_trl.vllm.engine.das_engine_kwargs` and ``das-trl serve``
pass it). It runs in vLLM's engine-core process,
needs synchronous scheduling (which vLLM uses for a ``custom_class`` drafter anyway) and changes nothing in an engine
without drafts.
"""

from __future__ import annotations

from itertools import islice

import numpy as np
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from das_trl.budget.step_cap import cap_step_tokens

from .admission_padding import unpad_admissions

# Waiting requests vLLM's admission loop takes as they are (others wait for a grammar, a KV transfer, a stream).
_ADMITTABLE = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class DASScheduler(Scheduler):
    """vLLM's V1 ``Scheduler`` with drafts cut to leave the budget to waiting and prefilling requests first.

    Counters (read in-process through ``llm.llm_engine.engine_core.engine_core.scheduler``): ``cut_draft_tokens``
    (draft tokens cut before they were scheduled) and ``cut_steps`` (steps with a cut).
    """

    cut_draft_tokens = 0
    cut_steps = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # A DAS step is never a uniform decode batch, so vLLM's padding of one-token admissions to 1 + K (kept for
        # the full CUDA graph) buys nothing and costs K rejected placeholder positions per admitted sibling.
        self.admissions_unpadded = unpad_admissions(self)

    def schedule(self, *args, **kwargs):
        """``Scheduler.schedule`` after :meth:`leave_room_for_waiting` (same arguments and output)."""
        throttled = bool(args[0] if args else kwargs.get("throttle_prefills", False))
        self.leave_room_for_waiting(throttled)
        return super().schedule(*args, **kwargs)

    def leave_room_for_waiting(self, throttled: bool = False) -> int:
        """Cut the running requests' drafts so that the step's token budget covers the running requests' own tokens
        and the waiting requests vLLM could admit now before any draft token.

        Args:
            throttled: ``schedule(throttle_prefills=True)`` (data-parallel prefill balancing): vLLM defers prefills
                this step unless its last admission step was capacity-bound, so none is reserved for.

        Returns:
            draft tokens cut (``int``; 0 when the drafts fit, nothing drafts, or nothing waits or prefills).
        """
        running = self.running
        budget = int(getattr(self, "max_num_scheduled_tokens", None) or self.scheduler_config.max_num_batched_tokens)
        # a waiting request can be admitted only into a free row (max_num_seqs); with none, nothing waits for budget
        waiting = (bool(self.waiting) or bool(getattr(self, "kv_holding_waiting", None))) and self._free_rows() > 0
        prefills = getattr(self, "_inflight_prefills", None)  # vLLM's set of requests still prefilling (0.32, 0.33)
        if (not waiting and prefills is not None and not prefills
                and budget >= self.scheduler_config.max_num_batched_tokens):
            # O(1): nothing to make room for, and the proposer keeps drafts within max_num_batched_tokens itself
            return 0
        threshold = self._long_prefill_threshold()
        own = 0  # tokens the running requests take without drafts: 1 per decoding row, a chunk per prefilling one
        prefilling = False
        drafting, lengths = [], []
        for r in running:
            if r.spec_token_ids:
                drafting.append(r)
                lengths.append(len(r.spec_token_ids))
            tokens = r.num_tokens + r.num_output_placeholders - r.num_computed_tokens
            if tokens > 1:
                prefilling = True
                if 0 < threshold < tokens:
                    tokens = threshold
            own += max(tokens, 0)
        if not drafting:
            return 0
        defer = throttled and not getattr(self, "prefill_capacity_bound", True)
        room = budget - own
        if room > 0 and not defer and waiting:
            room -= self._waiting_tokens(room, prefilling, threshold)
        total = sum(lengths)
        if total <= room:
            return 0
        kept = cap_step_tokens(np.asarray(lengths, np.int64), room)
        for request, n, k in zip(drafting, lengths, kept.tolist()):
            if k < n:
                request.spec_token_ids = request.spec_token_ids[:k]
        cut = total - int(kept.sum())
        self.cut_draft_tokens += cut
        self.cut_steps += 1
        return cut

    def _long_prefill_threshold(self) -> int:
        """vLLM's cap on one request's prefill chunk this step (0: none), as ``schedule`` derives it."""
        threshold = int(self.scheduler_config.long_prefill_token_threshold or 0)
        if threshold > 0 and getattr(self.scheduler_config, "long_prefill_token_threshold_adaptive", False):
            requests = len(self.running) + len(self.waiting) + len(getattr(self, "kv_holding_waiting", ()))
            threshold = max(threshold, self.scheduler_config.max_num_batched_tokens // max(requests, 1))
        return threshold

    def _waiting_tokens(self, room: int, prefilling: bool, threshold: int) -> int:
        """Tokens of ``room`` that vLLM's admission loop would give waiting requests this step without drafts.

        Mirrors the loop's limits (``Scheduler.schedule``, 0.32 and 0.33): free request slots (``max_num_seqs``),
        KV blocks for each whole prompt (``scheduler_reserve_full_isl``, vLLM's default; the watermark), prefix-cache
        hits, chunked prefill or not, and the padding of a one-token admission to 1 + K while no prefill runs.
        Approximate for hybrid (several KV groups) and KV-connector engines: it only decides how many draft tokens
        wait a step.
        """
        free_slots = self._free_rows()
        if free_slots <= 0:
            return 0
        queues = [q for q in (getattr(self, "kv_holding_waiting", None), self.waiting) if q]
        if not queues:
            return 0
        kv = self.kv_cache_manager
        pool = getattr(kv, "block_pool", None)
        free_blocks = pool.get_num_free_blocks() - int(getattr(kv, "watermark_blocks", 0)) if pool else None
        groups = max(len(getattr(self.kv_cache_config, "kv_cache_groups", ()) or ()), 1)
        chunked = self.scheduler_config.enable_chunked_prefill
        pad = int(getattr(self, "num_spec_tokens", 0) or 0) if getattr(self, "dynamic_sd_lookup", None) is None else 0
        taken = 0
        for queue in queues:
            for request in islice(queue, free_slots):
                if request.status not in _ADMITTABLE:
                    continue
                computed = request.num_computed_tokens or self._cached_tokens(request)
                tokens = request.num_tokens - computed
                if tokens <= 0:
                    continue
                if free_blocks is not None:
                    blocks = groups * -(-(request.num_tokens - computed) // self.block_size)
                    if blocks > free_blocks:
                        return taken  # vLLM stops admitting here (the KV cache is full)
                    free_blocks -= blocks
                if tokens == 1 and pad and not prefilling:
                    tokens = 1 + pad  # vLLM pads it to a uniform spec-decode row, or does not admit it
                if 0 < threshold < tokens:
                    tokens = threshold
                if tokens > room - taken:
                    if not chunked:
                        return taken  # without chunked prefill vLLM stops at a prompt that does not fit
                    return room
                taken += tokens
                free_slots -= 1
                if free_slots <= 0:
                    return taken
        return taken

    def _free_rows(self) -> int:
        """Requests vLLM could still admit into the running batch (``max_num_seqs`` less those running or paused)."""
        return (int(getattr(self, "max_num_active_reqs", self.max_num_running_reqs)) - len(self.running)
                - int(getattr(self, "num_waiting_for_streaming_input", 0)))

    def _cached_tokens(self, request: Request) -> int:
        """Prompt tokens of a new request found in the prefix cache (a read-only lookup; 0 with a KV connector,
        whose hits vLLM decides at admission)."""
        if self.connector is not None or not getattr(self.kv_cache_manager, "enable_caching", False):
            return 0
        try:
            return int(self.kv_cache_manager.get_computed_blocks(request)[1])
        except Exception:  # noqa: BLE001 - an estimate only: no hit is the safe side (room kept for the prompt)
            return 0
