"""DAS for TRL's experimental asynchronous GRPO trainer (``trl.experimental.async_grpo``, trl 1.16):
``DASAsyncGRPOConfig`` and ``DASAsyncGRPOTrainer`` (drop-in for ``AsyncGRPOConfig`` / ``AsyncGRPOTrainer``), and the
pieces they plug into TRL's protocols, usable on their own: ``DASRolloutWorker`` (rollout worker) and
``ReloadWeightTransfer`` (weight transfer without NCCL).

The asynchronous trainer is experimental in TRL and this package builds on its rollout loop's internals, so it is
tested with one TRL release (:data:`TESTED_TRL`); another release is warned about, and one without those internals
fails here with the version to install.
"""

import logging

import trl

#: The TRL release (major, minor) this package is tested with.
TESTED_TRL = (1, 16)

try:
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop  # noqa: F401
except ImportError as exc:
    raise ImportError(f"das_trl.trainer.async_grpo needs TRL's experimental asynchronous GRPO trainer as in trl "
                      f"{TESTED_TRL[0]}.{TESTED_TRL[1]} (pip install 'trl=={TESTED_TRL[0]}.{TESTED_TRL[1]}.*'); the "
                      f"installed trl {trl.__version__} does not have it: {exc}") from None

if tuple(int(part) for part in trl.__version__.split(".")[:2] if part.isdigit()) != TESTED_TRL:
    logging.getLogger(__name__).warning(
        "das_trl.trainer.async_grpo is tested with trl %d.%d; trl %s is installed (TRL's asynchronous trainer is "
        "experimental and may have changed)", *TESTED_TRL, trl.__version__)

from das_trl.trainer.async_grpo.config import DASAsyncGRPOConfig  # noqa: E402
from das_trl.trainer.async_grpo.rollout import DASRolloutWorker  # noqa: E402
from das_trl.trainer.async_grpo.trainer import DASAsyncGRPOTrainer  # noqa: E402
from das_trl.trainer.async_grpo.weight_transfer import ReloadWeightTransfer  # noqa: E402

__all__ = ["DASAsyncGRPOConfig", "DASAsyncGRPOTrainer", "DASRolloutWorker", "ReloadWeightTransfer", "TESTED_TRL"]
