"""Fast tests of the default reasoning-gym prompt data and reward functions (no model, no vLLM, no network)."""

from __future__ import annotations

import json

import datasets
import pytest

from das_trl.defaults.data import (
    DEFAULT_SYSTEM_PROMPT,
    decode_entry,
    encode_entry,
    load_prompt_dataset,
    load_reasoning_gym_dataset,
)
from das_trl.defaults.rewards import (
    FORMAT_REWARD,
    completion_text,
    correctness_reward,
    extract_answer,
    format_reward,
)


def _conv(text):
    """A completion as TRL 1.16's GRPOTrainer passes it for conversational prompts."""
    return [{"role": "assistant", "content": text}]


def _reward_kwargs(ds):
    """The extra keyword arguments GRPOTrainer._calculate_rewards passes: every column except ``prompt``."""
    return {k: ds[k] for k in ds.column_names if k != "prompt"} | {"trainer_state": None}


@pytest.fixture(scope="module")
def gsm():
    return load_reasoning_gym_dataset("gsm_symbolic", size=8, seed=0)


def test_dataset_shape_and_columns(gsm):
    assert isinstance(gsm, datasets.Dataset)
    assert len(gsm) == 8
    assert set(gsm.column_names) == {"prompt", "answer", "entry", "task", "problem_id"}
    row = gsm[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][0]["content"] == DEFAULT_SYSTEM_PROMPT
    assert "<answer>" in DEFAULT_SYSTEM_PROMPT
    entry = decode_entry(row["entry"])
    assert row["prompt"][1]["content"] == entry["question"]
    assert row["answer"] == str(entry["answer"]) and row["answer"].lstrip("-").isdigit()
    assert row["task"] == "gsm_symbolic"
    assert len(set(gsm["problem_id"])) == 8
    assert len(set(gsm["answer"])) > 1  # distinct problems, not one repeated


def test_no_system_prompt():
    ds = load_reasoning_gym_dataset("chain_sum", size=2, seed=0, system_prompt=None)
    assert [m["role"] for m in ds[0]["prompt"]] == ["user"]


def test_deterministic_per_seed(gsm):
    again = load_reasoning_gym_dataset("gsm_symbolic", size=8, seed=0)
    other = load_reasoning_gym_dataset("gsm_symbolic", size=8, seed=1)
    assert again.to_dict() == gsm.to_dict()
    assert other["entry"] != gsm["entry"]


def test_unknown_task_raises():
    with pytest.raises(ValueError, match="Unknown reasoning-gym task 'no_such_task'.*gsm_symbolic"):
        load_reasoning_gym_dataset("no_such_task")
    with pytest.raises(ValueError, match="Unknown reasoning-gym task"):
        load_prompt_dataset("rg:no_such_task")


def test_task_config():
    ds = load_reasoning_gym_dataset(
        "chain_sum", size=16, seed=0, task_config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    )
    for row in ds:
        assert decode_entry(row["entry"])["metadata"]["num_terms"] == 2
    with pytest.raises(ValueError, match="Invalid task_config"):
        load_reasoning_gym_dataset("chain_sum", size=2, task_config={"no_such_option": 1})


def test_load_prompt_dataset_dispatch(gsm, tmp_path):
    assert load_prompt_dataset("rg:gsm_symbolic", size=8, seed=0).to_dict() == gsm.to_dict()
    assert load_prompt_dataset("gsm_symbolic", size=8, seed=0).to_dict() == gsm.to_dict()
    # Anything else goes to datasets.load_dataset (here a local JSON file through the "json" builder).
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"question": q, "answer": a}) for q, a in [("1+1?", "2"), ("2+2?", "4")]))
    raw = load_prompt_dataset("json", data_files=str(path))
    assert raw.column_names == ["question", "answer"]
    conv = load_prompt_dataset("json", data_files=str(path), prompt_column="question", system_prompt=None)
    assert conv[1]["prompt"] == [{"role": "user", "content": "2+2?"}] and conv[1]["answer"] == "4"


def test_entry_roundtrip_keeps_tuples():
    entry = {"question": "q", "answer": "1", "metadata": {"grid": ((1, 2), (3, 4)), "s": {3}, "d": {(1, 2): "x"}}}
    assert decode_entry(encode_entry(entry)) == entry


@pytest.mark.parametrize("task", ["gsm_symbolic", "basic_arithmetic", "chain_sum", "arc_agi"])
def test_correct_answer_scores_one_wrong_scores_low(task):
    ds = load_reasoning_gym_dataset(task, size=4, seed=3)
    right = [_conv(f"Some reasoning.\n<answer>{a}</answer>") for a in ds["answer"]]
    assert correctness_reward(right, **_reward_kwargs(ds)) == [1.0] * 4
    assert format_reward(right, **_reward_kwargs(ds)) == [FORMAT_REWARD] * 4
    wrong = [_conv("<answer>definitely not it</answer>")] * 4
    assert correctness_reward(wrong, **_reward_kwargs(ds)) == [0.0] * 4


def test_wrong_number_gsm(gsm):
    # gsm_symbolic's verifier gives 0.01 partial credit for a well-formed wrong number (documented).
    wrong = [_conv(f"<answer>{int(a) + 1}</answer>") for a in gsm["answer"]]
    assert correctness_reward(wrong, **_reward_kwargs(gsm)) == [0.01] * len(gsm)


def test_fallbacks_and_plain_text(gsm):
    a = gsm["answer"][0]
    kwargs = {"entry": gsm["entry"][:1], "task": gsm["task"][:1]}
    # Last number when there is no <answer> tag; plain-string completions (non-conversational data) work too.
    assert correctness_reward([f"7 + 8 = 15, so the total is {a}."], **kwargs) == [1.0]
    assert format_reward([f"the total is {a}."]) == [0.0]
    # Last <answer> block wins; an unclosed final <answer> (truncated completion) is still read.
    assert correctness_reward([_conv(f"<answer>1</answer> wait <answer>{a}</answer>")], **kwargs) == [1.0]
    assert correctness_reward([_conv(f"<answer>{a}")], **kwargs) == [1.0]
    # Task missing from the columns: taken from the entry's metadata.
    assert correctness_reward([_conv(f"<answer>{a}</answer>")], entry=gsm["entry"][:1]) == [1.0]
    assert extract_answer("x <answer> </answer>") is None
    assert extract_answer("costs 1,234.5 dollars") == "1234.5"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]) == "hi"


def test_malformed_completions_give_zero(gsm):
    a = gsm["answer"][0]
    malformed = [None, 42, [], [{"role": "assistant", "content": None}], [{"no_role": 1}], "", _conv("no digits")]
    n = len(malformed)
    entry, task = [gsm["entry"][0]] * n, [gsm["task"][0]] * n
    assert correctness_reward(malformed, entry=entry, task=task) == [0.0] * n
    assert format_reward(malformed) == [0.0] * n
    good = _conv(f"<answer>{a}</answer>")
    # Malformed entries / tasks / missing columns never raise either.
    assert correctness_reward([good], entry=["{not json"], task=["gsm_symbolic"]) == [0.0]
    assert correctness_reward([good], entry=[gsm["entry"][0]], task=["no_such_task"]) == [0.0]
    assert correctness_reward([good]) == [0.0]
    assert correctness_reward([good, good], entry=[gsm["entry"][0]], task=["gsm_symbolic"]) == [1.0, 0.0]
