"""Asynchronous GRPO with DAS speculative rollouts: TRL's experimental ``AsyncGRPOTrainer`` as ``DASAsyncGRPOTrainer``.

The rollout worker keeps generating against the server while the trainer trains; at every weight sync the rollouts
it scored since the previous one go into the server's drafter history. Start the server first, then the trainer::

    das-trl serve --model MODEL --max-model-len 1024 &
    python recipes/async_grpo_das.py --vllm_server_base_url http://127.0.0.1:8000 --output_dir runs/async \
        --max_steps 20 --bf16 false

Takes any ``AsyncGRPOConfig`` / ``DASAsyncGRPOConfig`` field and ``--model_name_or_path`` as a flag or from
``--config FILE``, and the data and reward arguments of ``recipes/grpo_das.py``. Without ``--model_name_or_path`` it
trains the embedded SmolLM2-135M-Instruct (serve it with ``das-trl serve`` and no ``--model``). Reward functions are pickled into the
rollout worker's process: names from ``grpo_das.REWARD_FUNCS`` or a module-level ``module:function``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from trl import ModelConfig, TrlParser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpo_das import ScriptArguments, recipe_trainer_kwargs  # noqa: E402

from das_trl.trainer.async_grpo import DASAsyncGRPOConfig, DASAsyncGRPOTrainer  # noqa: E402


@dataclass
class ModelArguments:
    """The model (TRL's ``ModelConfig`` would clash with ``AsyncGRPOConfig.dtype``; LoRA is not offered here)."""

    model_name_or_path: str | None = field(default=None, metadata={
        "help": "model path or hub name, the one the server serves (default: the embedded SmolLM2-135M-Instruct)"})


def main() -> None:
    parser = TrlParser((ScriptArguments, DASAsyncGRPOConfig, ModelArguments))
    script_args, training_args, model_args = parser.parse_args_and_config()
    kwargs = recipe_trainer_kwargs(script_args, ModelConfig(model_name_or_path=model_args.model_name_or_path))
    trainer = DASAsyncGRPOTrainer(args=training_args, **kwargs)
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    main()
