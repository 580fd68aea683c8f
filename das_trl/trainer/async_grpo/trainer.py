"""``DASAsyncGRPOTrainer``: TRL 1.16's experimental ``AsyncGRPOTrainer`` with DAS speculative rollouts.

Swap the class name (and ``AsyncGRPOConfig`` for :class:`~das_trl.trainer.async_grpo.DASAsyncGRPOConfig`, or keep
it: the ``das_*`` defaults apply) and start the server with ``das-trl serve``. Through TRL's own protocols:

- rollout worker: TRL's default worker becomes a :class:`~das_trl.trainer.async_grpo.rollout.DASRolloutWorker` with
  the same arguments. Its child process pushes the rollouts scored since the previous weight sync into the server's
  drafter history at every model-version change (one history step per version, per problem, with the digest check
  and repair of :class:`~das_trl.trainer.DASGRPOTrainer`), and sends the ``das/*`` metrics of each push to the
  trainer's logs through the worker's metrics queue;
- weight transfer: where TRL's NCCL transfer cannot work (CPU builds), a
  :class:`~das_trl.trainer.async_grpo.weight_transfer.ReloadWeightTransfer` (vLLM's in-place reload from a file);
- at construction, before the model loads: the server must answer and run DAS (the drafter is attached with the
  config's ``das_*`` settings) and the sampling parameters must be ones vLLM accepts with speculation.

The worker's history mirror is kept in ``<output_dir>/das_history/das_history.npz``, copied into every checkpoint,
and loaded into the server on ``train(resume_from_checkpoint=...)``. On a CPU-only torch it also registers a torch
tree attention and guards TRL's peak-FLOPs lookup (:mod:`das_trl.trainer.async_grpo.cpu`).
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import time
from typing import Any

import requests
from accelerate import PartialState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl.experimental.async_grpo import AsyncGRPOTrainer
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

from das_trl.trainer.async_grpo.config import ASYNC_WEIGHT_SYNC_MODES, DASAsyncGRPOConfig
from das_trl.trainer.async_grpo.cpu import cpu_peak_flops_guard, register_cpu_tree_attention
from das_trl.trainer.async_grpo.history import history_dir_of
from das_trl.trainer.async_grpo.response_parsing import ensure_response_parsing
from das_trl.trainer.async_grpo.rollout import DASRolloutWorker
from das_trl.trainer.async_grpo.weight_transfer import ReloadWeightTransfer
from das_trl.trainer.callback import HISTORY_FILE
from das_trl.trainer.config import das_settings, validate_das_settings
from das_trl.trainer.generation import attach_drafter
from das_trl.vllm.client import DASEngineError, HTTPDASEngine
from das_trl.vllm.engine import is_cpu_build
from das_trl.vllm.sampling_check import refuse_unsupported_sampling

logger = logging.getLogger(__name__)


class DASAsyncGRPOTrainer(AsyncGRPOTrainer):
    """``trl.experimental.async_grpo.AsyncGRPOTrainer`` with DAS speculative rollouts; same arguments.

    Raises:
        DASEngineError: at construction, when the server cannot be reached or does not run DAS.
        ValueError: invalid ``das_*`` settings, or sampling parameters vLLM rejects with speculation on.
    """

    def __init__(self, model: str, *args: Any, **kwargs: Any):
        params = inspect.signature(AsyncGRPOTrainer.__init__).bind(self, model, *args, **kwargs).arguments
        params.pop("self")
        if params.get("args") is None:
            params["args"] = DASAsyncGRPOConfig(f"{model.split('/')[-1]}-AsyncGRPO")
        config = params["args"]
        self.das = das_settings(config)
        validate_das_settings(self.das)
        if self.das["weight_sync"] not in ASYNC_WEIGHT_SYNC_MODES:
            raise ValueError(f"das_weight_sync must be one of {ASYNC_WEIGHT_SYNC_MODES} for DASAsyncGRPOTrainer, got "
                             f"{self.das['weight_sync']!r}")
        refuse_unsupported_sampling(config, "DASAsyncGRPOTrainer", cpu_build=is_cpu_build())
        self.das_limits = self._das_attach(config) if PartialState().is_main_process else {}
        if params.get("weight_transfer") is None and self._das_weight_sync() == "reload":
            params["weight_transfer"] = ReloadWeightTransfer(config.vllm_server_base_url,
                                                             timeout=config.weight_sync_timeout)
        with cpu_peak_flops_guard():
            super().__init__(**params)
        if self.accelerator.device.type == "cpu":
            # TRL's tree attention is FlashAttention-3 from the Hub (CUDA/ROCm): the same attention in torch.
            register_cpu_tree_attention()
        self.das_history_dir = history_dir_of(self.args.output_dir)
        ensure_response_parsing(self.processing_class)  # else the worker's child process dies at train()
        if self.accelerator.is_main_process:
            self._das_use_rollout_worker()

    # ----------------------------------------------------------------------------------------------------------------
    def _das_weight_sync(self) -> str:
        """The resolved ``das_weight_sync``: 'auto' is 'reload' on CPU builds (no NCCL there), else TRL's 'nccl'."""
        if self.das["weight_sync"] != "auto":
            return self.das["weight_sync"]
        return "reload" if is_cpu_build() else "nccl"

    def _das_attach(self, config: Any) -> dict[str, Any]:
        """Wait for the server (``vllm_server_timeout``), check it runs DAS and attach the drafter with this run's
        settings; returns the engine's limits (``max_model_len``, ``num_speculative_tokens``).

        Raises:
            DASEngineError: the server did not answer in time, or does not run the DAS drafter.
        """
        engine = HTTPDASEngine(config.vllm_server_base_url)
        deadline = time.monotonic() + config.vllm_server_timeout
        while not engine.health():
            if time.monotonic() > deadline:
                raise DASEngineError(
                    f"{engine.name} did not answer /health within vllm_server_timeout={config.vllm_server_timeout} "
                    "s. Start it first: `das-trl serve --model MODEL` (check vllm_server_base_url).")
            time.sleep(1.0)
        if not self.das["check_engine"]:
            return {}
        attach_drafter(engine, self.das, "DASAsyncGRPOTrainer")
        return dict(engine.limits)

    def _das_server_is_cpu(self) -> bool:
        """Whether the server runs on CPU (its dev-mode ``/server_info`` device; this machine's vLLM build when the
        server does not say or says ``"auto"``)."""
        try:
            response = requests.get(f"{self.args.vllm_server_base_url.rstrip('/')}/server_info",
                                    params={"config_format": "json"}, timeout=30)
            device = ((response.json().get("vllm_config") or {}).get("device_config") or {}).get("device")
        except (requests.exceptions.RequestException, ValueError, AttributeError):
            device = None
        if not isinstance(device, str) or device == "auto":
            return is_cpu_build()
        return device == "cpu"

    def _das_use_rollout_worker(self) -> None:
        """Rebuild TRL's default rollout worker (not started yet) as a :class:`DASRolloutWorker` with the same
        arguments; keep a custom worker as it is (warning unless it is one)."""
        worker = self.rollout_worker
        if isinstance(worker, DASRolloutWorker):
            return
        if type(worker) is not AsyncRolloutWorker:
            logger.warning("DASAsyncGRPOTrainer: the custom rollout worker %s is used as it is: its rollouts reach the "
                           "drafter history only if it is a DASRolloutWorker", type(worker).__name__)
            return
        kwargs = dict(worker._loop_kwargs)  # TRL's loop arguments (async_grpo_trainer.py, AsyncRolloutWorker(...))
        queue_maxsize = kwargs.pop("queue_maxsize")
        kwargs.pop("dataset_start_index", None)
        self.rollout_worker = DASRolloutWorker(
            queue_maxsize=queue_maxsize,
            das_history={"window": self.das["window"], "token_budget": self.das["history_token_budget"],
                         "history_dir": self.das_history_dir, "restore_dir": None, "limits": self.das_limits},
            das_drop_seed=self._das_server_is_cpu(),
            **kwargs,
        )
        self.rollout_queue = self.rollout_worker.rollout_buffer

    # ----------------------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """``Trainer.train``; when resuming, the rollout worker loads the checkpoint's drafter history into the server
        before its first rollout."""
        if isinstance(self.rollout_worker, DASRolloutWorker):
            path = None
            if resume_from_checkpoint:
                path = (resume_from_checkpoint if isinstance(resume_from_checkpoint, str)
                        else get_last_checkpoint(self.args.output_dir))
            self.rollout_worker._loop_kwargs["das_history"]["restore_dir"] = path
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """``AsyncGRPOTrainer._save_checkpoint`` plus the rollout worker's drafter history (``das_history.npz``)."""
        super()._save_checkpoint(model, trial)
        source = os.path.join(self.das_history_dir, HISTORY_FILE)
        if self.args.should_save and os.path.exists(source):
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            shutil.copyfile(source, os.path.join(folder, HISTORY_FILE))
            logger.info("DAS history saved to %s", folder)
