"""The trainer's own callback: at the end of each optimizer step, the step's rollouts go into the drafter history.

Callbacks do not receive the trainer, so :class:`~das_trl.trainer.DASGRPOTrainer` constructs this one with a
reference to itself and adds it to its callback list.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class DASHistoryCallback(TrainerCallback):
    """Calls ``trainer.das_push_history()`` on every ``on_step_end``.

    ``on_step_end`` runs before the trainer logs the step, so the ``das/*`` metrics of the push are logged with it.
    """

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.das_push_history()
        return control
