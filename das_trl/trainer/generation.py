"""``DASVLLMGeneration``: TRL's ``VLLMGeneration`` with engines that run the DAS drafter.

What changes from TRL (trl 1.14-1.16, ``trl/generation/vllm_generation.py``):

- colocate mode builds the in-process ``vllm.LLM`` with TRL's arguments (including its bitsandbytes quantization for
  QLoRA models) plus the DAS speculative config and worker extension, then attaches the drafter; settings that cannot
  run the drafter are refused first (:mod:`das_trl.vllm.engine_check`);
- server mode checks, before anything else, that the server is reachable and runs DAS (clear error otherwise), and
  talks to it through TRL's client with the image-prompt endpoint's replies read as vLLM 0.32/0.33 write them
  (:mod:`das_trl.trainer.trl_client`);
- weights reach the engine by vLLM's ``reload_weights`` where TRL's transfer cannot work (CPU builds: no NCCL, and the
  CPU build repacks weights after loading, so TRL's direct ``load_weights`` push fails);
- :meth:`push_history` sends a step's rollouts into every engine's drafter history.

Generation itself is TRL's: the same requests, sampling parameters and returned logprobs.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from trl.generation.vllm_generation import VLLMGeneration

from das_trl.trainer.config import drafter_config_fields
from das_trl.trainer.quantization import engine_quantization
from das_trl.vllm.client import DASEngine, DASEngineError, HTTPDASEngine, LocalDASEngine
from das_trl.vllm.dtype import colocate_engine_dtype, dtype_mismatch_message, trainer_compute_dtype
from das_trl.vllm.engine import (das_engine_kwargs, default_max_num_batched_tokens, fit_model_len, is_cpu_build,
                                  model_context_length, model_len_with_headroom)
from das_trl.vllm.engine_check import check_engine_settings

logger = logging.getLogger(__name__)

#: Why ``enable_lora`` is refused in the colocated engine's arguments.
LORA_IN_ENGINE_MESSAGE = (
    "das_vllm_kwargs sets enable_lora, which DASGRPOTrainer does not use: like TRL, it merges a PEFT/LoRA adapter "
    "into the base weights before every weight sync, so the engine serves the merged model and DAS drafts and "
    "verifies it as any other model. LoRA adapters inside the engine together with a speculative drafter are not "
    "tested with das-trl on vLLM 0.32 (vLLM's LoRA layers were long restricted with speculative decoding). Remove "
    "enable_lora (and any max_lora_rank / max_loras) from das_vllm_kwargs."
)

#: Colocated-engine arguments that TRL's colocate mode sets and ``das_vllm_kwargs`` may not replace (key -> what to do
#: instead).
TRL_OWNED_ENGINE_KWARGS = {
    "model": "the engine serves the trainer's model (the model argument of DASGRPOTrainer)",
    "tensor_parallel_size": "colocate mode supports vllm_tensor_parallel_size=1",
    "distributed_executor_backend": "colocate mode runs vLLM inside each training process (external_launcher)",
}


def attach_drafter(engine: DASEngine, das: dict[str, Any], who: str) -> dict[str, Any]:
    """Attach the engine's drafter with a trainer's ``das_*`` settings (:func:`drafter_config_fields`); returns the
    drafter's stats (``engine.limits`` holds the engine's sizes afterwards).

    Raises:
        DASEngineError: the engine does not run the DAS drafter or refused the settings (the message names ``who``).
    """
    try:
        stats = engine.attach(drafter_config_fields(das))
    except DASEngineError as exc:
        raise DASEngineError(f"{who} cannot use the vLLM engine: {exc}") from None
    logger.info("DAS drafter attached (K=%s, history tokens=%s, engine dtype %s)",
                stats.get("num_speculative_tokens"), stats.get("history_tokens"), stats.get("engine_dtype"))
    return stats


class DASVLLMGeneration(VLLMGeneration):
    """TRL's vLLM generation backend, with the DAS drafter in the engine.

    Args:
        das: settings from :func:`~das_trl.trainer.config.das_settings`.
        **kwargs: ``VLLMGeneration``'s arguments, unchanged.

    Raises:
        DASEngineError: (server mode) the server is down, not in dev mode, or not running DAS.
    """

    def __init__(self, *, das: dict[str, Any], **kwargs: Any):
        self.das = das
        self.engine: DASEngine | None = None  # set on the process that talks to an engine
        self.weight_sync_seconds = 0.0  # cumulative time spent in sync_weights
        self.weight_sync = self._resolve_weight_sync(das["weight_sync"], kwargs.get("mode", "colocate"))
        super().__init__(**kwargs)

    @staticmethod
    def _resolve_weight_sync(requested: str, mode: str) -> str:
        if requested != "auto":
            return requested
        if is_cpu_build():
            return "reload"
        return "nccl" if mode == "server" else "inplace"

    # ----------------------------------------------------------------------------------------------------------------
    def _init_vllm(self) -> None:
        if self.mode == "server":
            self._init_server()
        elif self.mode == "colocate":
            self._init_colocate()
        else:
            raise ValueError(f"vllm_mode must be either 'server' or 'colocate', got '{self.mode}'.")
        self.accelerator.wait_for_everyone()

    def _init_server(self) -> None:
        from das_trl.trainer.trl_client import DASVLLMClient

        if not self.accelerator.is_main_process:
            return
        base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
        if "0.0.0.0" in base_url:  # TRL's default host: a bind address, not one to connect to
            base_url = base_url.replace("0.0.0.0", "127.0.0.1")
        engine = HTTPDASEngine(base_url)
        # Like TRL's client, give a server that is still starting up to vllm_server_timeout seconds.
        deadline = time.monotonic() + self.server_timeout
        while not engine.health() and time.monotonic() < deadline:
            time.sleep(1.0)
        if self.das["check_engine"]:
            self._check_engine(engine)
        self.engine = engine
        # TRL's client, reading the generate endpoint (image prompts) as vLLM 0.32/0.33 write it.
        self.vllm_client = DASVLLMClient(base_url=base_url, group_port=self.group_port,
                                         connection_timeout=self.server_timeout)
        if self.weight_sync == "nccl":
            self.vllm_client.init_communicator(device=self.accelerator.device)

    def _init_colocate(self) -> None:
        from trl.generation.vllm_generation import LLM, ensure_master_addr_port

        if self.tensor_parallel_size != 1:
            # TRL's TP subgroups would need the same history on every TP rank; not wired yet.
            raise NotImplementedError("DASGRPOTrainer colocate mode supports vllm_tensor_parallel_size=1 for now")
        os.environ["RANK"] = str(self.accelerator.process_index)
        os.environ["LOCAL_RANK"] = str(self.accelerator.local_process_index)
        os.environ["WORLD_SIZE"] = str(self.accelerator.num_processes)
        ensure_master_addr_port()
        kwargs = self._colocate_llm_kwargs()
        logger.info("vLLM engine dtype %s: %s", kwargs["dtype"], self._dtype_reason)
        self.llm = LLM(**kwargs)
        if self.das["enabled"]:
            engine = LocalDASEngine(self.llm)
            self._check_engine(engine)
            self.engine = engine
        if self.enable_sleep_mode:
            self.llm.sleep(level=2)
        self._llm_weights_sleeping = self.enable_sleep_mode

    def _colocate_llm_kwargs(self) -> dict[str, Any]:
        """The colocated ``vllm.LLM``'s keyword arguments: TRL's colocate arguments (trl 1.16) and the DAS engine's
        sizes as defaults, then ``das_vllm_kwargs``, which override any of them.

        The DAS defaults (also with ``das_enabled=False``, so an A/B run compares the same engine with and without
        drafts): ``max_model_len`` = ``vllm_max_model_length`` + K (:func:`~das_trl.vllm.engine.model_len_with_headroom`;
        unset: the model's own length), clamped to the model's context length with a warning that says what the
        clamp costs (:func:`~das_trl.vllm.engine.fit_model_len`); ``max_num_batched_tokens`` from
        :func:`~das_trl.vllm.engine.default_max_num_batched_tokens` (TRL's 4096 on CPU builds for the batches a CPU
        runs; on GPUs at least 8192).

        Raises:
            ValueError: ``das_vllm_kwargs`` sets a key TRL's colocate mode owns (``model``, ``tensor_parallel_size``,
                ``distributed_executor_backend``), sets ``enable_lora``, or asks for settings that cannot run the
                drafter (:func:`~das_trl.vllm.engine_check.check_engine_settings`).
        """
        user = dict(self.das["vllm_kwargs"] or {})
        for key, use in TRL_OWNED_ENGINE_KWARGS.items():
            if key in user:
                raise ValueError(f"das_vllm_kwargs sets {key}={user[key]!r}, which TRL's colocate mode sets itself. "
                                 f"Remove it from das_vllm_kwargs; {use}.")
        if user.get("enable_lora"):
            raise ValueError(LORA_IN_ENGINE_MESSAGE)
        k = self.das["num_speculative_tokens"]
        kwargs: dict[str, Any] = {
            # TRL's colocate arguments (trl 1.16 VLLMGeneration._init_vllm), TRL's values as defaults.
            "model": self.model.name_or_path,
            "tensor_parallel_size": 1,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_length,
            "max_num_seqs": self.max_num_seqs,
            "enable_sleep_mode": self.enable_sleep_mode,
            "model_impl": self.model_impl,
            "distributed_executor_backend": "external_launcher",
            "seed": self.accelerator.process_index,
            "logprobs_mode": "processed_logprobs",
            "trust_remote_code": self.trust_remote_code,
            "disable_log_stats": False,  # vLLM's spec-decode counters
            # The DAS engine's sizes (das_trl.vllm.engine): draft tokens count against the batched-token budget, and
            # vLLM skips the drafter for a whole step when any row is within K tokens of max_model_len.
            "max_num_batched_tokens": default_max_num_batched_tokens(k, self.max_num_seqs, is_cpu_build()),
        }
        if self.max_model_length is not None:
            config = getattr(self.model, "config", None)
            context = model_context_length(config) if config is not None else None
            kwargs["max_model_len"], clamped = fit_model_len(self.max_model_length, k, context)
            if clamped and "max_model_len" not in user:
                logger.warning("%s (vllm_max_model_length, das_num_speculative_tokens)", clamped)
        if self.das["enabled"]:
            kwargs.update(das_engine_kwargs(k))
        kwargs.update(user)
        if self.das["enabled"]:
            check_engine_settings(kwargs)
        # TRL's quantization for the engine (QLoRA: "bitsandbytes"; an 8-bit model is refused); an explicit
        # das_vllm_kwargs["quantization"] wins.
        kwargs.setdefault("quantization", engine_quantization(self.model))
        kwargs["dtype"], self._dtype_reason = colocate_engine_dtype(user, self.model, self.accelerator.mixed_precision)
        return kwargs

    def _check_engine(self, engine: DASEngine) -> None:
        """Attach the drafter with this run's settings; any failure becomes a clear :class:`DASEngineError`."""
        stats = attach_drafter(engine, self.das, "DASGRPOTrainer")
        self._check_headroom_at_start(engine.limits)
        mismatch = dtype_mismatch_message(stats.get("engine_dtype"),
                                          trainer_compute_dtype(self.model, self.accelerator.mixed_precision))
        if mismatch:
            logger.warning("%s", mismatch)

    def _check_headroom_at_start(self, limits: dict[str, Any]) -> None:
        """Log how long a prompt can be while the drafter keeps running to the end of a full-length completion; warn
        (with the setting to change) when not even a short prompt can (see :meth:`headroom_advice`)."""
        max_model_len, completion = limits.get("max_model_len"), getattr(self, "max_completion_length", None)
        if not max_model_len or not completion:
            return
        k = int(limits.get("num_speculative_tokens") or self.das["num_speculative_tokens"])
        room = int(max_model_len) - int(completion) - k
        if room < 1:
            logger.warning("%s", self.headroom_advice(None, None, 1))
        else:
            logger.info("engine max_model_len %s: prompts of up to %s tokens keep DAS drafting to the end of a "
                        "%s-token completion (K=%s tokens of headroom)", max_model_len, room, completion, k)

    def headroom_advice(self, short: int | None, rows: int | None, longest_prompt: int) -> str:
        """The warning for rollouts that came within K tokens of the engine's ``max_model_len``, with the setting
        that gives them room (colocate: ``vllm_max_model_length`` or ``das_vllm_kwargs["max_model_len"]``; server:
        ``das-trl serve --max-model-len``).

        Args:
            short, rows: how many of how many rollouts lacked room (``None``: checked at start, before any rollout).
            longest_prompt: the longest prompt seen, in tokens (1 at start).
        """
        limits = getattr(self.engine, "limits", None) or {}
        k = int(limits.get("num_speculative_tokens") or self.das["num_speculative_tokens"])
        completion = int(getattr(self, "max_completion_length", 0) or 0)
        need = model_len_with_headroom(longest_prompt + completion, k)
        what = (f"{short} of {rows} rollouts this step reached within K={k} tokens of" if short is not None else
                f"max_completion_length={completion} leaves no room for a prompt and K={k} draft tokens in")
        if self.mode == "server":
            fix = f"restart `das-trl serve` with --max-model-len {need} or more"
        elif (self.das["vllm_kwargs"] or {}).get("max_model_len") is not None:
            fix = f"set das_vllm_kwargs['max_model_len'] to {need} or more"
        else:
            fix = (f"set vllm_max_model_length to {longest_prompt + completion} or more (the longest prompt + "
                   f"max_completion_length; das-trl adds K for the engine)")
        return (f"{what} the engine's max_model_len={limits.get('max_model_len')}: while any running request is that "
                f"close, vLLM does not call the drafter and schedules {k} placeholder draft tokens for every request "
                f"of the step, verified and rejected (wasted verification in the long-rollout tail). Next step: {fix}. "
                f"See docs/gpu.md, 'Engine settings for DAS'.")

    # ----------------------------------------------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """Push the policy's current weights into the engine (see ``das_weight_sync``); the time taken is added to
        ``self.weight_sync_seconds``."""
        started = time.perf_counter()
        try:
            self._sync_weights()
        finally:
            self.weight_sync_seconds += time.perf_counter() - started

    def _sync_weights(self) -> None:
        if self.weight_sync in ("nccl", "inplace"):
            return super().sync_weights()
        if self.mode == "colocate" and self.enable_sleep_mode:
            self.llm.wake_up(tags=["weights"])
            self._llm_weights_sleeping = False
        # Clone while iterating: with PEFT, TRL's iterator merges adapters, yields, then unmerges.
        named = [(name, param.detach().clone()) for name, param in self._iter_named_params()]
        if self.mode == "colocate":
            LocalDASEngine(self.llm).reload_weights(named)
        elif self.accelerator.is_main_process:
            HTTPDASEngine(self.vllm_client.base_url).reload_weights(named)

    # ----------------------------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Shut the colocated engine down now, while the process group it was built on still exists; idempotent.

        vLLM tears an in-process engine down from a finalizer (at interpreter exit at the latest), and that teardown
        destroys vLLM's process groups. When a script has already destroyed the default process group
        (``trainer.end()`` in transformers >= 5.18, as TRL's own ``trl/scripts/grpo.py`` calls it), the finalizer
        fails with ``ValueError: Invalid process group specified``. :meth:`DASGRPOTrainer.end` calls this first, so
        the engine goes down in order: vLLM's teardown (which also destroys the default group it shares), then
        accelerate's (which finds nothing left to destroy). Server mode: the server is not ours; nothing is done.
        """
        llm = getattr(self, "llm", None)
        if self.mode != "colocate" or llm is None:
            return
        self.engine = None
        self.llm = None
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if client is not None and hasattr(client, "shutdown"):
            client.shutdown()  # runs vLLM's own teardown now and detaches its exit-time finalizer
        logger.info("colocated vLLM engine shut down")

    # ----------------------------------------------------------------------------------------------------------------
    def push_history(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> dict[str, Any] | None:
        """Add rollouts to this process's engine's history; returns the engine's reply (``None`` if no engine here).

        Raises:
            DASEngineError: the engine rejected the payload or went away.
        """
        if self.engine is None:
            return None
        return self.engine.add_history(prompt_ids, completion_ids)

    def das_stats(self) -> dict[str, Any] | None:
        """The engine's DAS stats (``None`` on processes without an engine or with DAS disabled)."""
        return None if self.engine is None else self.engine.stats()

