"""Trainer layer: ``DASGRPOConfig`` and ``DASGRPOTrainer`` (drop-in replacements for TRL's GRPO classes)."""

from das_trl.trainer.config import DASGRPOConfig
from das_trl.trainer.trainer import DASGRPOTrainer

__all__ = ["DASGRPOConfig", "DASGRPOTrainer"]
