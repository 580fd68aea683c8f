"""``ReloadWeightTransfer``: TRL's ``WeightTransferProtocol`` by vLLM's in-place ``reload_weights`` (no NCCL).

TRL 1.16's default, ``WeightTransferClient`` (``trl/experimental/async_grpo/weight_transfer.py``), streams weights over
NCCL, which needs CUDA on both sides. This one writes the trainer's weights to a safetensors file and has every
engine of the server reload from it (the DAS worker extension's ``das_reload_weights``, which also re-ties a tied
``lm_head`` and redoes the CPU build's weight repacking), so it works on CPU builds; the server must read this
machine's files. :class:`~das_trl.trainer.async_grpo.DASAsyncGRPOTrainer` uses it where NCCL cannot work
(``das_weight_sync="auto"`` on a CPU build, or ``"reload"``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import requests
import torch

from das_trl.vllm.client import DASEngineError, HTTPDASEngine

logger = logging.getLogger(__name__)


class ReloadWeightTransfer:
    """Weight sync for ``AsyncGRPOTrainer(weight_transfer=...)``: pause, reload from a file, resume.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:8000"`` (``das-trl serve``: dev mode and the DAS worker
            extension).
        timeout: seconds allowed for each call (the reload scales with model size).

    Pause keeps in-flight requests (vLLM's ``POST /pause?mode=keep``, as TRL's NCCL path): they continue on the new
    weights after ``resume``, the asynchronous trainer's partial-rollout behaviour.
    """

    def __init__(self, base_url: str, timeout: float = 1800.0):
        self.engine = HTTPDASEngine(base_url, timeout=timeout)
        self.timeout = timeout
        self.seconds = 0.0  # cumulative time in send_weights

    def init_weight_transfer(self) -> None:
        """Wait for the server (no transfer group to build)."""
        if not self.engine.health():
            raise DASEngineError(f"{self.engine.name} does not answer /health: start it with `das-trl serve --model "
                                 "MODEL` before the trainer")

    def pause(self) -> None:
        """Freeze in-flight requests (kept, resumed by :meth:`resume`).

        Raises:
            DASEngineError: the server refused or is unreachable.
        """
        self._post("/pause", params={"mode": "keep"})

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Reload the engine's weights from ``(name, tensor)`` pairs in checkpoint naming (the trainer's own
        parameters; a tied ``lm_head`` is not among them and is re-tied by the worker).

        Raises:
            DASEngineError: a worker failed to reload (the server keeps its previous weights on that worker).
        """
        started = time.perf_counter()
        self.engine.reload_weights(iterator)
        self.seconds += time.perf_counter() - started
        logger.debug("weights reloaded in %.1f s", time.perf_counter() - started)

    def resume(self) -> None:
        """Resume generation after the reload."""
        self._post("/resume")

    def destroy(self) -> None:
        """Nothing to release."""

    def _post(self, path: str, params: dict[str, str] | None = None) -> None:
        try:
            response = requests.post(f"{self.engine.base_url}{path}", params=params, timeout=self.timeout)
        except requests.exceptions.RequestException as exc:
            raise DASEngineError(f"{self.engine.name}: {path} failed ({type(exc).__name__}: {exc})") from None
        if response.status_code != 200:
            raise DASEngineError(f"{self.engine.name}: {path} failed with HTTP {response.status_code}: "
                                 f"{response.text[:300]} (the server needs VLLM_SERVER_DEV_MODE=1: `das-trl serve` "
                                 "sets it)")
