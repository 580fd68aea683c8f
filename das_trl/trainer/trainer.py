"""``DASGRPOTrainer``: a drop-in ``GRPOTrainer`` whose vLLM rollouts are drafted by DAS.

Swap the class name; everything ``GRPOTrainer`` accepts is accepted unchanged (a plain ``GRPOConfig`` gets the DAS
defaults of :class:`~das_trl.trainer.config.DASGRPOConfig`). With ``use_vllm=True`` the trainer:

1. builds (colocate) or checks (server) a vLLM engine running the DAS proposer — a server that is down or does not
   run DAS fails here, with a message, not later as a hang;
2. records each step's rollouts (prompt and completion token ids) as ``_generate`` returns them;
3. pushes them into every engine's drafter history at the end of the step (:class:`DASHistoryCallback`), so the
   next steps draft from the run's own recent rollouts;
4. logs ``das/*`` metrics through TRL's normal logging.

Without ``use_vllm`` it is exactly ``GRPOTrainer`` (DAS needs a vLLM engine; a warning says so).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from accelerate.utils import gather_object
from trl import GRPOTrainer

from das_trl.drafter.rollout_log import RolloutRecord, append_records
from das_trl.trainer.callback import DASHistoryCallback
from das_trl.trainer.config import das_settings, validate_das_settings
from das_trl.trainer.generation import DASVLLMGeneration
from das_trl.vllm.client import DASEngineError

logger = logging.getLogger(__name__)

# Proposer counters whose per-step differences become das/* metrics.
_COUNTERS = ("request_rounds", "drafts", "draft_tokens", "accepted_tokens", "verified_drafts", "speculation_seconds")


class DASGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with DAS speculative rollouts; same constructor arguments as ``trl.GRPOTrainer``.

    Raises:
        DASEngineError: at construction, when the vLLM engine cannot be reached or does not run DAS.
        ValueError: invalid ``das_*`` settings.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        grpo_args = kwargs.get("args") if "args" in kwargs else (args[2] if len(args) > 2 else None)
        use_vllm = bool(getattr(grpo_args, "use_vllm", False))
        self.das = das_settings(grpo_args)
        validate_das_settings(self.das)
        self._das_pending: list[tuple[list[list[int]], list[list[int]]]] = []
        self._das_last_counters: dict[str, float] = {}
        self._das_rollout_seconds = 0.0
        self._das_weight_sync_seconds = 0.0
        if use_vllm:
            # Let GRPOTrainer set everything up except its vLLM backend, then build ours with the same arguments.
            grpo_args.use_vllm = False
        try:
            super().__init__(*args, **kwargs)
        finally:
            if use_vllm:
                grpo_args.use_vllm = True
        if not use_vllm:
            logger.warning("DASGRPOTrainer without use_vllm=True generates with transformers: DAS is not used.")
            return
        self.use_vllm = True
        self.vllm_generation = self._build_vllm_generation(grpo_args)
        self._last_loaded_step = -1
        if self.das["enabled"]:
            self.add_callback(DASHistoryCallback(self))

    def _build_vllm_generation(self, args: Any) -> DASVLLMGeneration:
        # The same arguments GRPOTrainer.__init__ passes to VLLMGeneration (trl 1.16).
        return DASVLLMGeneration(
            das=self.das,
            model=self.model,
            accelerator=self.accelerator,
            processing_class=self.processing_class,
            mode=args.vllm_mode,
            structured_outputs_regex=args.vllm_structured_outputs_regex,
            server_base_url=args.vllm_server_base_url,
            server_host=args.vllm_server_host,
            server_port=args.vllm_server_port,
            group_port=args.vllm_group_port,
            server_timeout=args.vllm_server_timeout,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_length=args.vllm_max_model_length,
            max_num_seqs=args.per_device_train_batch_size * args.vllm_tensor_parallel_size
            * args.steps_per_generation,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            model_impl=args.vllm_model_impl,
            trust_remote_code=args.trust_remote_code,
            repetition_penalty=self.repetition_penalty,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            max_completion_length=self.max_completion_length,
            logprobs=0,
            generation_kwargs=args.generation_kwargs,
        )

    # ----------------------------------------------------------------------------------------------------------------
    def _generate(self, prompts: list, *args: Any, **kwargs: Any):
        """TRL's ``_generate``, timed, with the rollouts recorded for the history push."""
        started = time.perf_counter()
        sync_before = self.vllm_generation.weight_sync_seconds if self.use_vllm else 0.0
        result = super()._generate(prompts, *args, **kwargs)
        sync = (self.vllm_generation.weight_sync_seconds - sync_before) if self.use_vllm else 0.0
        # Rollout time is generation only; the weight push that TRL does first is logged on its own.
        self._das_rollout_seconds += time.perf_counter() - started - sync
        self._das_weight_sync_seconds += sync
        if self.use_vllm and self.das["enabled"] and self.model.training:
            prompt_ids, completion_ids = result[0], result[1]
            self._das_pending.append(([list(p) for p in prompt_ids], [list(c) for c in completion_ids]))
        return result

    def das_push_history(self) -> None:
        """Send the recorded rollouts to the engine(s) and log ``das/*`` metrics; called at each step's end.

        A failed push does not stop training: it is logged as a warning and the rollouts stay queued, so the next
        push carries them.
        """
        pending, self._das_pending = self._das_pending, []
        prompts = [p for batch in pending for p in batch[0]]
        completions = [c for batch in pending for c in batch[1]]
        # Every engine holds the whole step's history: in server mode one engine (main process), in colocate mode one
        # engine per process, each given every process's rollouts.
        prompts, completions = gather_object(prompts), gather_object(completions)
        metrics: dict[str, float] = {"das/rollout_seconds": self._das_rollout_seconds,
                                     "das/weight_sync_seconds": self._das_weight_sync_seconds}
        self._das_rollout_seconds = self._das_weight_sync_seconds = 0.0
        generation = self.vllm_generation
        if generation.engine is not None:
            try:
                stats_before = generation.das_stats()
                if prompts:
                    reply = generation.push_history(prompts, completions)
                    stats = reply["stats"]
                    metrics["das/history_update_seconds"] = float(reply["seconds"])
                else:
                    stats = stats_before
                metrics.update(self._das_step_metrics(stats_before))
                metrics.update({
                    "das/history_problems": stats.get("history_problems", 0),
                    "das/history_tokens": stats.get("history_tokens", 0),
                    "das/history_bytes": stats.get("history_bytes", 0),
                })
            except DASEngineError as exc:
                logger.warning("DAS history push failed (training continues; retried next step): %s", exc)
                self._das_pending = pending + self._das_pending
        if self.das["record_rollouts"] and prompts and self.accelerator.is_main_process:
            self._das_record(prompts, completions)
        mode = "train"
        for key, value in metrics.items():
            self._metrics[mode][key].append(float(value))

    def _das_record(self, prompts: list[list[int]], completions: list[list[int]]) -> None:
        """Append this step's rollouts to ``das_record_rollouts`` (JSONL, :mod:`das_trl.drafter.rollout_log`)."""
        limit = self.max_completion_length
        records = [
            RolloutRecord.make(self.state.global_step - 1, self.state.epoch or 0.0, p, c,
                               "length" if len(c) >= limit else "stop")
            for p, c in zip(prompts, completions)
        ]
        append_records(self.das["record_rollouts"], records)

    def _das_step_metrics(self, stats: dict[str, Any]) -> dict[str, float]:
        """Per-step differences of the proposer's counters, as das/* metrics."""
        delta = {k: float(stats.get(k, 0)) - self._das_last_counters.get(k, 0.0) for k in _COUNTERS}
        self._das_last_counters = {k: float(stats.get(k, 0)) for k in _COUNTERS}
        rounds = delta["request_rounds"]
        return {
            "das/draft_tokens": delta["draft_tokens"],
            "das/accepted_tokens": delta["accepted_tokens"],
            "das/acceptance_rate": delta["accepted_tokens"] / delta["draft_tokens"] if delta["draft_tokens"] else 0.0,
            "das/tokens_per_round": (rounds + delta["accepted_tokens"]) / rounds if rounds else 1.0,
            "das/speculated_share": delta["drafts"] / rounds if rounds else 0.0,
            "das/speculation_seconds": delta["speculation_seconds"],
        }
