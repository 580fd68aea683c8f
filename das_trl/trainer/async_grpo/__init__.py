"""DAS for TRL's experimental asynchronous GRPO trainer (``trl.experimental.async_grpo``, trl 1.16):
``DASAsyncGRPOConfig`` and ``DASAsyncGRPOTrainer`` (drop-in for ``AsyncGRPOConfig`` / ``AsyncGRPOTrainer``), and the
pieces they plug into TRL's protocols, usable on their own: ``DASRolloutWorker`` (rollout worker) and
``ReloadWeightTransfer`` (weight transfer without NCCL)."""

from das_trl.trainer.async_grpo.config import DASAsyncGRPOConfig
from das_trl.trainer.async_grpo.rollout import DASRolloutWorker
from das_trl.trainer.async_grpo.trainer import DASAsyncGRPOTrainer
from das_trl.trainer.async_grpo.weight_transfer import ReloadWeightTransfer

__all__ = ["DASAsyncGRPOConfig", "DASAsyncGRPOTrainer", "DASRolloutWorker", "ReloadWeightTransfer"]
