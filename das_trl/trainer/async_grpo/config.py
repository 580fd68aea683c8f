"""``DASAsyncGRPOConfig``: TRL's ``AsyncGRPOConfig`` plus the ``das_*`` fields that apply to a server-side drafter.

The fields, defaults and help texts are :class:`~das_trl.trainer.DASGRPOConfig`'s (one source). Left out: what only a
colocated engine or the synchronous trainer uses (``das_vllm_kwargs``, ``das_enabled``, ``das_record_rollouts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl.experimental.async_grpo import AsyncGRPOConfig

from das_trl.trainer.config import DASGRPOConfig, das_settings, validate_das_settings

#: ``das_weight_sync`` values the asynchronous trainer takes ('inplace' is colocate-only).
ASYNC_WEIGHT_SYNC_MODES = ("auto", "nccl", "reload")


def _das_field(name: str) -> Any:
    """``DASGRPOConfig``'s field ``name`` (default and help text) for this config."""
    source = DASGRPOConfig.__dataclass_fields__[name]
    return field(default=source.default, metadata=dict(source.metadata))


@dataclass
class DASAsyncGRPOConfig(AsyncGRPOConfig):
    """``AsyncGRPOConfig`` with DAS speculative rollouts; every ``das_*`` field is documented in its ``help``.

    ``das_weight_sync``: 'auto' (vLLM's in-place reload from a file on CPU builds, TRL's NCCL transfer elsewhere),
    'nccl' or 'reload'.
    """

    das_num_speculative_tokens: int = _das_field("das_num_speculative_tokens")
    das_window: int = _das_field("das_window")
    das_history_token_budget: int = _das_field("das_history_token_budget")
    das_live_token_budget: int = _das_field("das_live_token_budget")
    das_max_spec_factor: float = _das_field("das_max_spec_factor")
    das_min_token_prob: float = _das_field("das_min_token_prob")
    das_max_tree_depth: int | None = _das_field("das_max_tree_depth")
    das_calibrate_acceptance: bool = _das_field("das_calibrate_acceptance")
    das_budget_controller: dict | str | None = _das_field("das_budget_controller")
    das_weight_sync: str = _das_field("das_weight_sync")
    das_check_engine: bool = _das_field("das_check_engine")

    def __post_init__(self):
        super().__post_init__()
        validate_das_settings(das_settings(self))
        if self.das_weight_sync not in ASYNC_WEIGHT_SYNC_MODES:
            raise ValueError(f"das_weight_sync must be one of {ASYNC_WEIGHT_SYNC_MODES} for the asynchronous trainer, "
                             f"got {self.das_weight_sync!r} ('inplace' needs a colocated engine, which "
                             "AsyncGRPOTrainer does not have)")
