"""``DASGRPOTrainer``: a drop-in ``GRPOTrainer`` whose vLLM rollouts are drafted by DAS.

Swap the class name; everything ``GRPOTrainer`` accepts is accepted unchanged (a plain ``GRPOConfig`` gets the DAS
defaults of :class:`~das_trl.trainer.config.DASGRPOConfig`). With ``use_vllm=True`` the trainer:

1. builds (colocate) or checks (server) a vLLM engine running the DAS proposer — a server that is down or does not
   run DAS fails here, with a message, not later as a hang;
2. records each step's rollouts (prompt and completion token ids) as ``_generate`` returns them;
3. pushes them into every engine's drafter history at the end of the step (:class:`DASHistoryCallback`), so the
   next steps draft from the run's own recent rollouts;
4. keeps a mirror of that history (:class:`DASHistoryMirror`): after each push every engine's history digest is
   compared with the mirror's, and an engine that diverged or missed a push gets the whole mirror loaded back;
   the mirror is saved in every checkpoint (``das_history.npz``) and loaded into the engines on resume;
5. logs ``das/*`` metrics through TRL's normal logging.

Sampling parameters that vLLM rejects with speculation on (``min_p``, ``logit_bias``, ...) fail at construction
(:mod:`das_trl.vllm.sampling_check`). If the engine goes away mid-run, the step fails with a
:class:`~das_trl.vllm.client.DASEngineError` that says how to resume.

Without ``use_vllm`` it is exactly ``GRPOTrainer`` (DAS needs a vLLM engine; a warning says so).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import requests
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl import GRPOTrainer

from das_trl.drafter import native, problem_key
from das_trl.drafter.rollout_log import RolloutRecord, append_records
from das_trl.trainer.callback import DASHistoryCallback, DASHistoryMirror
from das_trl.trainer.config import das_settings, validate_das_settings
from das_trl.trainer.generation import DASVLLMGeneration
from das_trl.trainer.history_sync import push_history
from das_trl.trainer.problem_ids import problem_ids_of
from das_trl.trainer.trl_client import failed_request_status
from das_trl.vllm.client import DASEngineError, HTTPDASEngine
from das_trl.vllm.sampling_check import refuse_unsupported_sampling

logger = logging.getLogger(__name__)


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
        # Per _generate call: (prompt ids, completion ids, explicit problem keys or None).
        self._das_pending: list[tuple[list[list[int]], list[list[int]], list[int] | None]] = []
        self._das_problem_ids: list[int] | None = None  # das_problem_id column of the batch being generated
        self._das_mirror: DASHistoryMirror | None = None
        # True when the engine's history may differ from the mirror (start, failed push): the next push loads the
        # whole mirror instead of the step's rollouts.
        self._das_stale = True
        self._das_last_counters: dict[str, float] = {}
        # Rollouts this step that came within K tokens of the engine's max_model_len (vLLM then skips the drafter for
        # the whole batch: das/headroom_short_rows); warned about once per run.
        self._das_headroom_short_rows = 0
        self._das_headroom_warned = False
        self._das_rollout_seconds = 0.0
        self._das_weight_sync_seconds = 0.0
        # Whether the engine drafts with the native core (das/native_core): known here for the in-process engine
        # (colocate); a server reports its own (`das-trl serve` warns at its start).
        self._das_native_core: bool | None = None
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
        if self.das["enabled"]:
            self._das_check_sampling(grpo_args)
            if grpo_args.vllm_mode == "colocate":
                # A silent slow path is a bug: warn (not only log) when the drafter would fall back to Python.
                self._das_native_core = native.warn_if_unavailable("DASGRPOTrainer")
        self.vllm_generation = self._build_vllm_generation(grpo_args)
        self._last_loaded_step = -1
        if self.das["enabled"]:
            self._das_mirror = DASHistoryMirror(self.das["window"], self.das["history_token_budget"])
            self.add_callback(DASHistoryCallback(self))

    def _das_check_sampling(self, args: Any) -> None:
        """Fail early on sampling parameters vLLM rejects with speculation on; log the ones that weaken it."""
        from das_trl.vllm.engine import is_cpu_build

        refuse_unsupported_sampling(args, "DASGRPOTrainer", cpu_build=is_cpu_build())

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
    def _generate_and_score_completions(self, inputs: list, *args: Any, **kwargs: Any):
        """TRL's method; first notes the batch's ``das_problem_id`` column (if any) for the history push."""
        self._das_problem_ids = problem_ids_of(inputs) if self.use_vllm and self.das["enabled"] else None
        return super()._generate_and_score_completions(inputs, *args, **kwargs)

    def _generate(self, prompts: list, *args: Any, **kwargs: Any):
        """TRL's ``_generate``, timed, with the rollouts recorded for the history push."""
        started = time.perf_counter()
        sync_before = self.vllm_generation.weight_sync_seconds if self.use_vllm else 0.0
        try:
            result = super()._generate(prompts, *args, **kwargs)
        except Exception as exc:
            if not self._das_server_lost(exc):
                raise
            raise DASEngineError(self._das_engine_lost_message(exc)) from exc
        sync = (self.vllm_generation.weight_sync_seconds - sync_before) if self.use_vllm else 0.0
        # Rollout time is generation only; the weight push that TRL does first is logged on its own.
        self._das_rollout_seconds += time.perf_counter() - started - sync
        self._das_weight_sync_seconds += sync
        if self.use_vllm and self.das["enabled"] and self.model.training:
            prompt_ids, completion_ids = result[0], result[1]
            keys = self._das_problem_ids
            if keys is not None and len(keys) != len(prompt_ids):
                logger.warning("das_problem_id: %d ids for %d rollouts; keying this batch by prompt", len(keys),
                               len(prompt_ids))
                keys = None
            self._das_pending.append(([list(p) for p in prompt_ids], [list(c) for c in completion_ids], keys))
            self._das_check_headroom(prompt_ids, completion_ids)
        return result

    def _das_check_headroom(self, prompt_ids: list, completion_ids: list) -> None:
        """Count this batch's rollouts whose prompt + completion + K exceeds the engine's ``max_model_len``, and warn
        once (with the setting to change) when there are any.

        While any running row is within K tokens of ``max_model_len``, vLLM 0.32/0.33 do not call the drafter for that
        step and schedule K zero-token placeholder drafts for *every* row, which the next step verifies and rejects
        (``GPUModelRunner._input_fits_in_drafter`` and ``sample_tokens``): wasted verification exactly in the
        long-rollout tail.
        """
        engine = self.vllm_generation.engine
        limits = getattr(engine, "limits", None) or {}
        max_model_len = limits.get("max_model_len")
        if not max_model_len or not prompt_ids:
            return
        k = int(limits.get("num_speculative_tokens") or self.das["num_speculative_tokens"])
        lengths = [(len(p), len(c)) for p, c in zip(prompt_ids, completion_ids)]
        short = sum(1 for p, c in lengths if p + c + k > max_model_len)
        self._das_headroom_short_rows = getattr(self, "_das_headroom_short_rows", 0) + short
        if short and not getattr(self, "_das_headroom_warned", False):
            self._das_headroom_warned = True
            longest_prompt = max(p for p, _ in lengths)
            logger.warning("%s", self.vllm_generation.headroom_advice(short, len(lengths), longest_prompt))

    def _das_server_lost(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised while generating, means that the vLLM server or its engine went away (server mode):
        the server cannot be reached or timed out, a DAS call failed, or TRL's client got a 5xx reply
        (``Exception("Request failed: 500, ...")``, e.g. vLLM's ``EngineDeadError`` when an engine process died) from
        a server whose ``/health`` no longer answers 200."""
        if not self.use_vllm or getattr(self.vllm_generation, "mode", None) != "server":
            return False
        if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, DASEngineError)):
            return True
        status = failed_request_status(exc)
        if status is None or status < 500:
            return False
        engine = self.vllm_generation.engine
        return not (isinstance(engine, HTTPDASEngine) and engine.health())

    def _das_engine_lost_message(self, exc: BaseException) -> str:
        step = self.state.global_step + 1
        last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
        where = f"the last checkpoint is {last}" if last else "no checkpoint has been saved yet (set save_steps)"
        return (
            f"the vLLM engine went away during step {step}: {type(exc).__name__}: {str(exc)[:300]}. Training stopped; "
            f"{where}. "
            "Restart the server (`das-trl serve --model MODEL ...`, or the `trl vllm-serve` command it was started "
            "with) and resume with "
            "trainer.train(resume_from_checkpoint=True): the drafter history is restored from the checkpoint."
        )

    def das_push_history(self) -> None:
        """Send the recorded rollouts to the engine(s), check every engine against the mirror, log ``das/*``
        metrics; called at each step's end.

        A failed push does not stop training: it is logged as a warning and the next push loads the whole mirror
        (which holds the missed rollouts) into the engine. An engine whose history digest differs from the mirror's
        after a push is reloaded from the mirror at once (warning, ``das/history_repairs``).
        """
        pending, self._das_pending = self._das_pending, []
        prompts = [p for batch in pending for p in batch[0]]
        completions = [c for batch in pending for c in batch[1]]
        # Explicit das_problem_id keys where the dataset has them, else the prompt's hash (the default key).
        keys = [k for batch in pending
                for k in (batch[2] if batch[2] is not None else [problem_key(p) for p in batch[0]])]
        # Every engine holds the whole step's history: in server mode one engine (main process), in colocate mode one
        # engine per process, each given every process's rollouts.
        prompts, completions, keys = gather_object(prompts), gather_object(completions), gather_object(keys)
        explicit = any(batch[2] is not None for batch in pending)
        explicit = any(gather_object([explicit]))
        problem_keys = keys if explicit else None  # None: the engines hash the prompts (same keys, smaller payload)
        metrics: dict[str, float] = {"das/rollout_seconds": self._das_rollout_seconds,
                                     "das/weight_sync_seconds": self._das_weight_sync_seconds}
        if self._das_native_core is not None:
            metrics["das/native_core"] = float(self._das_native_core)
        if getattr(self.vllm_generation.engine, "limits", None):
            metrics["das/headroom_short_rows"] = float(getattr(self, "_das_headroom_short_rows", 0))
        self._das_headroom_short_rows = 0
        self._das_rollout_seconds = self._das_weight_sync_seconds = 0.0
        if prompts and self._das_mirror is not None:
            self._das_mirror.record(prompts, completions, problem_keys)
        engine = self.vllm_generation.engine
        if engine is not None and self._das_mirror is not None:
            pushed, self._das_stale = push_history(engine, self._das_mirror, prompts, completions, problem_keys,
                                                   stale=self._das_stale, last_counters=self._das_last_counters)
            metrics.update(pushed)
        if self.das["record_rollouts"] and prompts and self.accelerator.is_main_process:
            self._das_record(prompts, completions)
        mode = "train"
        for key, value in metrics.items():
            self._metrics[mode][key].append(float(value))

    def das_restore_history(self, checkpoint_dir: str) -> bool:
        """Load ``checkpoint_dir/das_history.npz`` into the mirror and every engine (done by :meth:`train` when
        resuming, before the first rollout).

        Returns:
            True if the checkpoint had a history. A failed load into the engine is a warning: the next push retries.

        Raises:
            ValueError: the history file is corrupt.
        """
        if self._das_mirror is None or not self._das_mirror.load(checkpoint_dir):
            logger.warning("checkpoint %s has no DAS history: drafting restarts from an empty history", checkpoint_dir)
            return False
        self._das_stale = True
        engine = self.vllm_generation.engine
        if engine is not None:
            try:
                reply = engine.load_history(self._das_mirror.state())
                self._das_stale = False
                logger.info("DAS history restored from %s: %s problems, %s tokens", checkpoint_dir,
                            reply["stats"].get("history_problems"), reply["stats"].get("history_tokens"))
            except DASEngineError as exc:
                logger.warning("could not restore the DAS history into the engine (retried at the next push): %s", exc)
        return True

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """``Trainer.train``; when resuming, the checkpoint's drafter history is loaded into every engine first."""
        if resume_from_checkpoint and self._das_mirror is not None:
            path = (resume_from_checkpoint if isinstance(resume_from_checkpoint, str)
                    else get_last_checkpoint(self.args.output_dir))
            if path:
                self.das_restore_history(path)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def end(self) -> None:
        """``Trainer.end`` (transformers >= 5.18: finish the trackers, destroy the process group), with the colocated
        vLLM engine shut down first, in order (:meth:`DASVLLMGeneration.shutdown`), so that vLLM's exit-time teardown
        does not meet an already destroyed process group."""
        if self.use_vllm and isinstance(getattr(self, "vllm_generation", None), DASVLLMGeneration):
            self.vllm_generation.shutdown()
        parent_end = getattr(super(), "end", None)
        if parent_end is not None:
            parent_end()
        else:  # transformers < 5.18 has no Trainer.end
            self.accelerator.end_training()

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """``Trainer._save_checkpoint`` plus the drafter history (``das_history.npz``) in the checkpoint folder."""
        super()._save_checkpoint(model, trial)
        if self._das_mirror is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            path = self._das_mirror.save(folder)
            logger.info("DAS history saved to %s", path)

    def _das_record(self, prompts: list[list[int]], completions: list[list[int]]) -> None:
        """Append this step's rollouts to ``das_record_rollouts`` (JSONL, :mod:`das_trl.drafter.rollout_log`)."""
        limit = self.max_completion_length
        records = [
            RolloutRecord.make(self.state.global_step - 1, self.state.epoch or 0.0, p, c,
                               "length" if len(c) >= limit else "stop")
            for p, c in zip(prompts, completions)
        ]
        append_records(self.das["record_rollouts"], records)
