"""``DASRolloutWorker``: TRL's asynchronous rollout worker whose completions feed the server's drafter history.

TRL 1.16's ``AsyncRolloutWorker`` (``trl/experimental/async_grpo/async_rollout_worker.py``) runs an asyncio loop in a
spawned child process: it generates against the vLLM server over ``/v1/completions``, scores whole groups and queues
them for the trainer, reading the live policy version from a shared counter the trainer bumps at each weight sync.
:class:`DASRolloutLoop` is that loop plus one task: it records each scored group and, when the version changes,
pushes the rollouts recorded since the previous change into the server's drafter history
(:class:`~das_trl.trainer.async_grpo.history.RolloutHistorySync`), then hands the push's ``das/*`` metrics to the
trainer through the worker's metrics queue (logged with TRL's other rollout metrics). Generation itself is TRL's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

from das_trl.trainer.async_grpo.history import RolloutHistorySync
from das_trl.vllm.client import HTTPDASEngine

logger = logging.getLogger(__name__)

#: Seconds between two looks at the shared model version (a push follows a weight sync by at most this much).
VERSION_POLL_SECONDS = 0.2


class DASRolloutLoop(_AsyncRolloutLoop):
    """TRL's rollout loop (runs in the worker's child process) with the drafter-history push.

    Args:
        das_history: keyword arguments of :class:`RolloutHistorySync` except ``engine`` (``window``,
            ``token_budget``, ``history_dir``, ``restore_dir``, ``limits``); the engine is the loop's own server.
        das_drop_seed: send TRL's generation requests without their per-request ``seed``. For a CPU server: vLLM's CPU
            build kills its engine on a seeded request whose prefill is cut short (``gpu_model_runner.py:3502``,
            ``RuntimeError: CPU Generator does not use offset``; vLLM 0.32). TRL seeds every request only to keep
            data-parallel engines from drawing the same samples, which a CPU server does not run.
        **loop_kwargs: TRL's ``_AsyncRolloutLoop`` arguments, unchanged.
    """

    def __init__(self, *, das_history: dict[str, Any], das_drop_seed: bool = False, **loop_kwargs: Any):
        super().__init__(**loop_kwargs)
        self._das_history = RolloutHistorySync(HTTPDASEngine(self.vllm_server_url), **das_history)
        self._das_drop_seed = das_drop_seed

    async def _post(self, path: str, payload: dict, timeout: float, max_retries: int = 3) -> dict:
        if self._das_drop_seed and "seed" in payload:
            payload = {key: value for key, value in payload.items() if key != "seed"}
        return await super()._post(path, payload, timeout, max_retries)

    async def _score_group(self, group: Any) -> list:
        self._das_history.record_group(group.completions_sequences, group.reward_kwargs)
        return await super()._score_group(group)

    async def _run_loops(self, stop_event: asyncio.Event) -> None:
        # Before the first rollout drafts: load the (empty or restored) mirror into the engine and take the counters'
        # baseline (the server's counters so far are not this run's, so this push's metrics are not logged).
        await asyncio.to_thread(self._das_history.push)
        task = asyncio.create_task(self._das_history_loop(stop_event))
        try:
            await super()._run_loops(stop_event)
        finally:
            stop_event.set()
            await task  # lets a push in progress finish (TRL's stop() waits 15 s for the child)

    async def _das_history_loop(self, stop_event: asyncio.Event) -> None:
        """Push at every model-version change (what was scored since the previous change: one history step)."""
        version = self.model_version
        while not stop_event.is_set():
            try:
                await asyncio.wait_for(stop_event.wait(), timeout=VERSION_POLL_SECONDS)
            except (TimeoutError, asyncio.TimeoutError):
                pass
            if self.model_version != version and not stop_event.is_set():
                version = self.model_version
                await self._das_push()

    async def _das_push(self) -> None:
        metrics = await asyncio.to_thread(self._das_history.push)
        metrics["das/model_version"] = float(self.model_version)
        self._push_metrics(metrics)


class DASRolloutWorker(AsyncRolloutWorker):
    """``AsyncRolloutWorker`` (same arguments) whose child runs :class:`DASRolloutLoop`.

    Pass ``das_history={...}`` and ``das_drop_seed`` (see :class:`DASRolloutLoop`) with TRL's arguments;
    :class:`~das_trl.trainer.async_grpo.DASAsyncGRPOTrainer` builds it for you.
    """

    _loop_cls = DASRolloutLoop
