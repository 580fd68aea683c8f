"""The DAS proposer that vLLM runs inside its worker (``speculative_config`` method ``custom_class``).

vLLM instantiates ``DASProposer(vllm_config)`` in the model runner and calls :meth:`DASProposer.propose` after every
engine step with the tokens each running request just got. ``propose`` receives no request ids, so until the worker
extension hands it the model runner (:meth:`DASProposer.attach`) it proposes nothing and says so in its stats. Once
attached, it maps each batch row to its request (``input_batch.req_ids``), feeds the request's new tokens to the
:class:`~das_trl.drafter.DASDrafter`, and returns one draft per row; vLLM's rejection sampler verifies the drafts, so
outputs are those of the target model.

Upstream API: ``vllm/v1/spec_decode/custom_class_proposer.py`` and ``GPUModelRunner.propose_draft_token_ids``
(vLLM 0.32), modelled on vLLM's own ``SuffixDecodingProposer``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from das_trl.drafter import DASDrafter, DrafterConfig

logger = logging.getLogger(__name__)

# SamplingParams.extra_args key (OpenAI field ``vllm_xargs``) for an explicit problem id; GRPO siblings share it.
PROBLEM_ID_KEY = "das_problem_id"


class DASProposer:
    """vLLM custom proposer backed by a :class:`DASDrafter`.

    Args:
        vllm_config: vLLM's ``VllmConfig``; ``speculative_config.num_speculative_tokens`` (K) is the most tokens vLLM
            schedules per request per round, so every draft is capped at K.

    Drafts are variable length (0..K tokens per request); vLLM pads them. Counters kept here (see :meth:`stats`) are
    the proposer's view; vLLM's ``spec_decode`` metrics remain the authoritative acceptance figures.
    """

    def __init__(self, vllm_config: Any):
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.drafter = DASDrafter(DrafterConfig(max_spec_tokens=self.num_speculative_tokens))
        self._runner: Any = None
        # Per request: output tokens already given to the drafter, and the length of its last draft.
        self._known_output: dict[str, int] = {}
        self._last_draft_len: dict[str, int] = {}
        self._counters = dict(
            rounds=0,
            unattached_rounds=0,
            request_rounds=0,
            drafts=0,
            draft_tokens=0,
            accepted_tokens=0,
            verified_drafts=0,
            speculation_seconds=0.0,
        )

    # vLLM's CPU runner calls this unconditionally; a suffix-tree drafter has no model to load.
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No-op: the drafter is built from rollout history, not from weights."""

    @property
    def attached(self) -> bool:
        """Whether :meth:`attach` has given the proposer its model runner (and so request identities)."""
        return self._runner is not None

    def attach(self, model_runner: Any, drafter_config: DrafterConfig | None = None) -> None:
        """Give the proposer the model runner whose ``input_batch`` maps batch rows to requests.

        Args:
            model_runner: vLLM's ``GPUModelRunner`` (also the CPU runner's base class).
            drafter_config: when given and different from the current one, the drafter is rebuilt with it and its
                history is carried over.

        Raises:
            TypeError: ``model_runner`` has no ``input_batch``.
        """
        if not hasattr(model_runner, "input_batch"):
            raise TypeError(f"{type(model_runner).__name__} has no input_batch: not a vLLM V1 model runner")
        if drafter_config is not None:
            if drafter_config.max_spec_tokens > self.num_speculative_tokens:
                raise ValueError(
                    f"max_spec_tokens={drafter_config.max_spec_tokens} exceeds the engine's num_speculative_tokens="
                    f"{self.num_speculative_tokens}"
                )
            if drafter_config != self.drafter.config:
                state = self.drafter.state_dict()
                self.drafter = DASDrafter(drafter_config)
                self.drafter.load_state_dict(state)
        self._runner = model_runner
        self._known_output.clear()
        self._last_draft_len.clear()

    def detach(self) -> None:
        """Forget the model runner: from the next round on the proposer drafts nothing (history is kept)."""
        for req_id in list(self._known_output):
            self._finish(req_id)
        self._runner = None

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Draft tokens for every request in the batch.

        Args:
            sampled_token_ids: per batch row, the tokens the row got this step (accepted drafts + one sampled token);
                empty for a partial prefill.
            num_tokens_no_spec: ``np.int32 [max_num_reqs]``: tokens per row (prompt + output), drafts excluded.
            token_ids_cpu: ``np.int32 [max_num_reqs, max_model_len]``: each row's tokens.
            slot_mappings: unused (no KV cache of our own).

        Returns:
            ``list[list[int]]`` with one draft (0..K token ids) per row of ``sampled_token_ids``.
        """
        self._counters["rounds"] += 1
        if self._runner is None:
            self._counters["unattached_rounds"] += 1
            return [[] for _ in sampled_token_ids]
        started = time.perf_counter()
        batch = self._runner.input_batch
        drafts: list[list[int]] = []
        live = set()
        for row, sampled in enumerate(sampled_token_ids):
            req_id = batch.req_ids[row]
            live.add(req_id)
            if not sampled:  # partial prefill: nothing to extend from yet
                drafts.append([])
                continue
            num_tokens = int(num_tokens_no_spec[row])
            num_prompt = int(batch.num_prompt_tokens[row])
            self._sync_request(req_id, row, num_prompt, num_tokens, len(sampled), token_ids_cpu)
            budget = min(self.num_speculative_tokens, self.max_model_len - num_tokens - 1)
            draft: list[int] = []
            if budget > 0:
                start = max(0, num_tokens - self.drafter.config.max_tree_depth)
                draft = self.drafter.propose(req_id, token_ids_cpu[row, start:num_tokens], budget)
            self._last_draft_len[req_id] = len(draft)
            self._counters["request_rounds"] += 1
            if draft:
                self._counters["drafts"] += 1
                self._counters["draft_tokens"] += len(draft)
            drafts.append(draft)
        for req_id in [r for r in self._known_output if r not in live]:
            self._finish(req_id)
        self._counters["speculation_seconds"] += time.perf_counter() - started
        return drafts

    def _sync_request(
        self, req_id: str, row: int, num_prompt: int, num_tokens: int, num_sampled: int, token_ids_cpu: np.ndarray
    ) -> None:
        """Start the request in the drafter on first sight and extend it with the output it gained since."""
        known = self._known_output.get(req_id)
        num_output = num_tokens - num_prompt
        if known is None or known > num_output:  # new, or preempted and recomputed from a shorter state
            if known is not None:
                self.drafter.stop_request(req_id)
            self.drafter.start_request(
                req_id, token_ids_cpu[row, :num_prompt].copy(), problem_key=self._explicit_problem_key(req_id)
            )
            known = 0
        else:
            # Rows that drafted last round got (accepted + 1) tokens this round.
            last = self._last_draft_len.get(req_id, 0)
            if last > 0:
                self._counters["verified_drafts"] += 1
                self._counters["accepted_tokens"] += min(last, num_sampled - 1)
        if num_output > known:
            self.drafter.extend_request(req_id, token_ids_cpu[row, num_prompt + known : num_tokens].tolist())
        self._known_output[req_id] = num_output

    def _explicit_problem_key(self, req_id: str) -> int | None:
        """The problem id sent as ``SamplingParams.extra_args[PROBLEM_ID_KEY]``, if any (else the prompt is hashed)."""
        request = getattr(self._runner, "requests", {}).get(req_id)
        extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
        value = extra.get(PROBLEM_ID_KEY)
        if value is None:
            return None
        try:
            key = int(value)
        except (TypeError, ValueError):
            logger.warning("ignoring non-integer %s=%r for request %s", PROBLEM_ID_KEY, value, req_id)
            return None
        return key if key >= 0 else None

    def _finish(self, req_id: str) -> None:
        self._known_output.pop(req_id, None)
        self._last_draft_len.pop(req_id, None)
        if req_id in self.drafter.active_requests:
            self.drafter.stop_request(req_id)

    def stats(self) -> dict[str, Any]:
        """Proposer counters merged with the drafter's stats (history size, sources); JSON-serializable.

        Keys: ``attached`` (bool), ``rounds`` (propose calls), ``unattached_rounds`` (calls that proposed nothing
        because :meth:`attach` had not run), ``request_rounds``, ``drafts`` (non-empty drafts), ``draft_tokens``,
        ``accepted_tokens`` (as seen by the proposer: the final draft of each request is never observed),
        ``speculation_seconds`` (time spent in :meth:`propose`), ``num_speculative_tokens``, ``history_problems``,
        ``history_appearances``, ``history_sequences``, ``history_tokens``, ``history_bytes`` (approximate),
        ``history_evicted_appearances``, ``active_requests`` and ``source_<name>`` (drafts won by each source).
        """
        out: dict[str, Any] = {"attached": self.attached, "num_speculative_tokens": self.num_speculative_tokens}
        out.update(self._counters)
        d = self.drafter.stats()
        out.update(
            history_problems=d["problems"],
            history_appearances=d["appearances"],
            history_sequences=d["sequences"],
            history_tokens=d["tokens"],
            history_bytes=d["approx_bytes"] + d["support_table_bytes"],
            history_evicted_appearances=d["evicted_appearances"],
            active_requests=d["active_requests"],
        )
        # Which source's candidate won each non-empty draft (per-problem history, running siblings, local, global).
        out.update({f"source_{name}": count for name, count in d["wins"].items()})
        return out

    def reset_counters(self) -> None:
        """Zero the proposer's counters (history is kept)."""
        for key in self._counters:
            self._counters[key] = 0.0 if key == "speculation_seconds" else 0
