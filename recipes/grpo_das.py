"""GRPO with DAS speculative rollouts: the TRL GRPO recipe with ``DASGRPOTrainer``.

Run with accelerate, TRL-style arguments (any ``GRPOConfig``/``DASGRPOConfig`` field, ``ModelConfig`` field, or the
script arguments below), or a YAML file through ``--config``::

    accelerate launch --cpu --num_processes 1 recipes/grpo_das.py --config recipes/configs/embedded_default.yaml
    accelerate launch recipes/grpo_das.py --model_name_or_path Qwen/Qwen3-0.6B --dataset rg:gsm_symbolic \
        --use_vllm --vllm_mode server --output_dir runs/qwen-gsm

Without ``--model_name_or_path`` it trains the embedded SmolLM2-135M-Instruct (no hub needed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import ModelConfig, TrlParser

from das_trl.defaults.data import load_prompt_dataset
from das_trl.defaults.model import prepare_default_model
from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
from das_trl.trainer import DASGRPOConfig, DASGRPOTrainer
from das_trl.trainer.progress import DASProgressCallback


@dataclass
class ScriptArguments:
    """Data arguments of the recipe."""

    dataset: str = field(default="rg:gsm_symbolic", metadata={
        "help": "'rg:<task>' for a reasoning-gym task (no hub), else a datasets name/path with a 'prompt' column"})
    dataset_size: int = field(default=64, metadata={"help": "reasoning-gym: number of problems"})
    dataset_seed: int = field(default=0, metadata={"help": "reasoning-gym: generation seed"})
    dataset_split: str = field(default="train", metadata={"help": "datasets: split to load"})


def main() -> None:
    parser = TrlParser((ScriptArguments, DASGRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    model = model_args.model_name_or_path or prepare_default_model()
    dataset = load_prompt_dataset(script_args.dataset, size=script_args.dataset_size, seed=script_args.dataset_seed,
                                  split=script_args.dataset_split)
    trainer = DASGRPOTrainer(
        model=model,
        reward_funcs=DEFAULT_REWARD_FUNCS,
        args=training_args,
        train_dataset=dataset,
        callbacks=[DASProgressCallback()],
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    main()
