"""The main job's recipe (recipes/configs/embedded_default.yaml): 1-digit reasoning-gym products, the arithmetic
system prompt, and rewards that separate a right equation, a wrong one and no equation (groups must have reward spread
for GRPO to learn)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _recipe():
    from test_docs import _load

    return _load(ROOT / "recipes" / "grpo_das.py", "grpo_das_recipe")


def test_embedded_default_dataset_prompt_and_rewards():
    from das_trl.defaults.data import ARITHMETIC_SYSTEM_PROMPT, load_prompt_dataset

    recipe = _recipe()
    values = yaml.safe_load((ROOT / "recipes" / "configs" / "embedded_default.yaml").read_text())
    assert values["dataset"] == "rg:products" and values["reward_funcs"] == ["rg_correctness", "equation"]
    system = recipe.SYSTEM_PROMPTS[values["system_prompt"]]
    assert system == ARITHMETIC_SYSTEM_PROMPT
    data = load_prompt_dataset(values["dataset"], size=values["dataset_size"], seed=values["dataset_seed"],
                               task_config=values["dataset_task_config"], system_prompt=system)
    correctness, equation = recipe.resolve_reward_funcs(values["reward_funcs"])
    for row in data:
        assert row["prompt"][0] == {"role": "system", "content": ARITHMETIC_SYSTEM_PROMPT}
        a, b = map(int, re.search(r"(\d) \* (\d)", row["prompt"][-1]["content"]).groups())
        right, wrong = f"{a} * {b} = {a * b}", f"{a} * {b} = {a * b + 1}"
        completions = [[{"role": "assistant", "content": c}] for c in (right, wrong, f"The result is {a * b}.")]
        kwargs = {"entry": [row["entry"]] * 3, "task": [row["task"]] * 3}
        rewards = [c + e for c, e in zip(correctness(completions, **kwargs), equation(completions))]
        assert rewards[0] == 1.2 and rewards[1] < 0.6 and rewards[2] == 1.0, (row["prompt"][-1], rewards)


def test_system_prompt_names_and_text():
    recipe = _recipe()
    assert recipe.SYSTEM_PROMPTS["none"] is None
    assert recipe.SYSTEM_PROMPTS.get("Be brief.", "Be brief.") == "Be brief."


def test_equation_reward_format_only():
    from das_trl.defaults.rewards import EQUATION_REWARD, equation_reward

    texts = ["3 * 4 = 12", "4*1 = 4", "2 x 3 = 7", "15 - 43 = 7", "The answer is 12", "1 * 5 is 5.", "= 4", ""]
    assert equation_reward(texts) == [EQUATION_REWARD] * 4 + [0.0] * 4
    assert equation_reward([None, 3, [{"role": "assistant", "content": "6 / 2 = 3"}]]) == [0.0, 0.0, EQUATION_REWARD]


def test_group_spread_summary():
    import pytest

    from das_trl.bench.micro.task_spread import _reward_funcs, group_spread

    out = group_spread([[1.0, 1.0], [0.0, 1.2]], correct=[[1.0, 1.0], [0.0, 1.0]])
    assert out["groups"] == 2 and out["flat_groups"] == 1 and out["flat_share"] == 0.5
    assert out["mean_group_std"] == pytest.approx(0.3) and out["mean_correct"] == 0.75
    with pytest.raises(ValueError):
        group_spread([[]])
    with pytest.raises(ValueError, match="unknown reward"):
        _reward_funcs(["nope"])


def test_recipe_flags_are_checked_before_the_model_is_converted(monkeypatch):
    """A mistyped ``--reward_funcs`` or ``--dataset_task_config`` failed only after ``prepare_default_model`` (the
    model's first conversion takes ~1 minute)."""
    import pytest
    from trl import ModelConfig

    recipe = _recipe()

    def converted():
        raise AssertionError("the model was prepared before the recipe's flags were checked")

    monkeypatch.setattr(recipe, "prepare_default_model", converted)
    with pytest.raises(ValueError, match="unknown reward function 'nope'"):
        recipe.recipe_trainer_kwargs(recipe.ScriptArguments(reward_funcs=["nope"]), ModelConfig())
    with pytest.raises(ValueError):
        recipe.recipe_trainer_kwargs(recipe.ScriptArguments(dataset_task_config="{bad"), ModelConfig())
