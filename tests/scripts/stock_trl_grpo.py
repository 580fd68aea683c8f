"""A GRPO training script for stock TRL, written the way TRL's documentation shows one (model name, dataset, reward
functions, ``GRPOConfig``, ``GRPOTrainer``, vLLM rollouts). It imports nothing from das-trl.

``tests/test_dropin.py`` runs it after replacing only the import line and the two class names
(``GRPOConfig`` -> ``DASGRPOConfig``, ``GRPOTrainer`` -> ``DASGRPOTrainer``), on the embedded model and data.

Environment (so the same file runs with a hub or without one):
    MODEL_NAME            model name or local path (default: Qwen/Qwen2.5-0.5B-Instruct, a hub model)
    DATASET               dataset name or local directory with a ``prompt`` and an ``answer`` column
    VLLM_MODE             "colocate" (default) or "server" (start the server first, e.g. ``trl vllm-serve``)
    VLLM_SERVER_BASE_URL  server mode: the server's URL
    OUTPUT_DIR            where the trainer writes
"""

import os
import re

from datasets import load_dataset
from trl import GRPOConfig, GRPOTrainer

dataset = load_dataset(os.environ.get("DATASET", "trl-lib/DeepMath-103K"), split="train")


def format_reward(completions, **kwargs):
    """Reward completions that put their final answer inside <answer> tags."""
    contents = [completion[0]["content"] for completion in completions]
    return [0.1 if re.search(r"<answer>.+?</answer>", content, re.DOTALL) else 0.0 for content in contents]


def accuracy_reward(completions, answer, **kwargs):
    """Reward completions whose tagged answer equals the reference answer."""
    rewards = []
    for completion, reference in zip(completions, answer):
        match = re.search(r"<answer>(.+?)</answer>", completion[0]["content"], re.DOTALL)
        rewards.append(1.0 if match and match.group(1).strip() == str(reference).strip() else 0.0)
    return rewards


training_args = GRPOConfig(
    output_dir=os.environ.get("OUTPUT_DIR", "grpo-output"),
    use_vllm=True,
    vllm_mode=os.environ.get("VLLM_MODE", "colocate"),
    vllm_server_base_url=os.environ.get("VLLM_SERVER_BASE_URL"),
    vllm_max_model_length=768,
    num_generations=4,
    per_device_train_batch_size=4,
    max_completion_length=48,
    max_steps=1,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    bf16=False,  # CPU machines
)
trainer = GRPOTrainer(
    model=os.environ.get("MODEL_NAME", "Qwen/Qwen2.5-0.5B-Instruct"),
    reward_funcs=[format_reward, accuracy_reward],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
