"""GRPO with DAS speculative rollouts: the TRL GRPO recipe with ``DASGRPOTrainer``.

Run with accelerate, TRL-style arguments (any ``GRPOConfig``/``DASGRPOConfig`` field, ``ModelConfig`` field, or the
script arguments below), or a YAML file through ``--config``::

    accelerate launch --cpu --num_processes 1 recipes/grpo_das.py --config recipes/configs/embedded_default.yaml
    accelerate launch recipes/grpo_das.py --model_name_or_path Qwen/Qwen3-0.6B --dataset rg:gsm_symbolic \
        --use_vllm --vllm_mode server --output_dir runs/qwen-gsm
    accelerate launch --config_file recipes/accelerate/one_gpu.yaml recipes/grpo_das.py \
        --config recipes/configs/qwen2.5-math-1.5b_gsm8k.yaml

Without ``--model_name_or_path`` it trains the embedded SmolLM2-135M-Instruct (no hub needed). Reward functions are
chosen by name (``--reward_funcs``, see :data:`REWARD_FUNCS`) or as ``module:function``.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import Callable

from trl import ModelConfig, TrlParser, get_peft_config

from das_trl.defaults.data import ARITHMETIC_SYSTEM_PROMPT, DEFAULT_SYSTEM_PROMPT, load_prompt_dataset
from das_trl.defaults.model import prepare_default_model
from das_trl.defaults.rewards import correctness_reward, equation_reward, format_reward, reference_answer_reward
from das_trl.trainer import DASGRPOConfig, DASGRPOTrainer
from das_trl.trainer.progress import DASProgressCallback


@dataclass
class ScriptArguments:
    """Data arguments of the recipe."""

    dataset: str = field(default="rg:gsm_symbolic", metadata={
        "help": "'rg:<task>' for a reasoning-gym task (no hub), else a datasets name/path with a 'prompt' column"})
    dataset_size: int = field(default=64, metadata={"help": "reasoning-gym: number of problems"})
    dataset_seed: int = field(default=0, metadata={"help": "reasoning-gym: generation seed"})
    dataset_task_config: dict | str | None = field(default=None, metadata={
        "help": "reasoning-gym: options of the task's config class as a dict (or JSON), e.g. "
                "{\"min_digits\": 1, \"max_digits\": 1} for 1-digit products"})
    system_prompt: str = field(default="default", metadata={
        "help": "system message of every prompt (reasoning-gym, and datasets with --prompt_column): a name from "
                "SYSTEM_PROMPTS ('default': short reasoning and <answer> tags; 'arithmetic': the computation as an "
                "equation, for small models; 'none': user-only prompts) or the message text itself"})
    dataset_split: str = field(default="train", metadata={"help": "datasets: split to load"})
    dataset_config: str | None = field(default=None, metadata={"help": "datasets: configuration name (gsm8k: main)"})
    prompt_column: str | None = field(default=None, metadata={
        "help": "datasets: build the conversational 'prompt' column from this text column (e.g. 'question')"})
    solution_column: str | None = field(default=None, metadata={
        "help": "datasets: copy this column to 'solution' (what trl.rewards.accuracy_reward reads)"})
    reward_funcs: list[str] = field(default_factory=lambda: ["rg_correctness", "format"], metadata={
        "help": "reward functions: names from REWARD_FUNCS or 'module:function'"})


def _trl_accuracy(*args, **kwargs):
    """``trl.rewards.accuracy_reward`` (math_verify; reads the 'solution' column), imported when used."""
    from trl.rewards import accuracy_reward

    return accuracy_reward(*args, **kwargs)


#: Reward functions by name: reasoning-gym's verifier, the <answer> format bonus, the equation-format bonus (small
#: models on arithmetic), exact match against an 'answer' column (GSM8K's "#### 72" understood), and TRL's math_verify
#: accuracy (pip install math-verify).
REWARD_FUNCS: dict[str, Callable] = {
    "rg_correctness": correctness_reward,
    "format": format_reward,
    "equation": equation_reward,
    "answer_match": reference_answer_reward,
    "trl_accuracy": _trl_accuracy,
}


#: System prompts by name (``--system_prompt``); any other value is used as the message text.
SYSTEM_PROMPTS: dict[str, str | None] = {
    "default": DEFAULT_SYSTEM_PROMPT,
    "arithmetic": ARITHMETIC_SYSTEM_PROMPT,
    "none": None,
}


def resolve_reward_funcs(names: list[str]) -> list[Callable]:
    """Reward functions for ``names`` (keys of :data:`REWARD_FUNCS` or ``module:function``).

    Raises:
        ValueError: an unknown name or an import path that does not resolve.
    """
    out = []
    for name in names:
        if name in REWARD_FUNCS:
            out.append(REWARD_FUNCS[name])
        elif ":" in name:
            module, _, attr = name.partition(":")
            try:
                out.append(getattr(importlib.import_module(module), attr))
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"reward function {name!r} does not resolve: {exc}") from None
        else:
            raise ValueError(f"unknown reward function {name!r}: use one of {sorted(REWARD_FUNCS)} or module:function")
    return out


def load_recipe_dataset(script_args: ScriptArguments):
    """The prompt dataset the script arguments describe (``--dataset`` and the options beside it).

    Raises:
        ValueError: ``--dataset_task_config`` is not valid JSON, or the loader refuses the data set.
    """
    task_config = script_args.dataset_task_config
    if isinstance(task_config, str):
        try:
            task_config = json.loads(task_config)
        except json.JSONDecodeError as exc:
            raise ValueError(f"dataset_task_config is not valid JSON: {exc}") from None
    system_prompt = SYSTEM_PROMPTS.get(script_args.system_prompt, script_args.system_prompt)
    dataset = load_prompt_dataset(script_args.dataset, size=script_args.dataset_size, seed=script_args.dataset_seed,
                                  split=script_args.dataset_split, config=script_args.dataset_config,
                                  prompt_column=script_args.prompt_column, task_config=task_config,
                                  system_prompt=system_prompt)
    if script_args.solution_column:
        dataset = dataset.map(lambda row: {"solution": row[script_args.solution_column]})
    return dataset


def recipe_trainer_kwargs(script_args: ScriptArguments, model_args: ModelConfig) -> dict:
    """The trainer arguments the recipe's flags give: ``model`` (``--model_name_or_path``, else the embedded
    SmolLM2-135M-Instruct), ``reward_funcs``, ``train_dataset`` and ``peft_config`` (LoRA with ``--use_peft``; the engine
    serves the merged weights)."""
    # The flags first: a mistyped reward or task config fails in a second, not after the model's first conversion.
    reward_funcs = resolve_reward_funcs(script_args.reward_funcs)
    train_dataset = load_recipe_dataset(script_args)
    return {
        "model": model_args.model_name_or_path or prepare_default_model(),
        "reward_funcs": reward_funcs,
        "train_dataset": train_dataset,
        "peft_config": get_peft_config(model_args),
    }


def main() -> None:
    parser = TrlParser((ScriptArguments, DASGRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    trainer = DASGRPOTrainer(args=training_args, callbacks=[DASProgressCallback()],
                             **recipe_trainer_kwargs(script_args, model_args))
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    main()
