"""Default prompt data: reasoning-gym tasks as TRL-ready conversational prompt datasets (no dataset hub needed).

reasoning-gym (``pip install reasoning-gym``) generates problems procedurally from a seed and ships a verifier per task
(``score_answer(answer, entry) -> float`` in ``[0, 1]``), so a GRPO run gets prompts *and* rewards without any download.

Two entry points:

* :func:`load_reasoning_gym_dataset` -- ``size`` problems of one reasoning-gym task, deterministic for a seed.
* :func:`load_prompt_dataset` -- dispatches by name: ``"rg:<task>"`` or a bare reasoning-gym task name
  (``"gsm_symbolic"``) goes to reasoning-gym; anything else (a hub name such as ``"openai/gsm8k"``, a local path or a
  builder name such as ``"json"``) goes to ``datasets.load_dataset(name, split=split, **load_kwargs)`` for users who
  have a hub.

Columns of a reasoning-gym dataset (TRL hands every column other than ``prompt`` to the reward functions as keyword
arguments, one value per completion):

* ``prompt``: ``[{"role": "system", ...}, {"role": "user", "content": question}]`` (system message omitted when
  ``system_prompt`` is ``None``) -- TRL's conversational prompt format.
* ``answer``: the reference answer as a string (reasoning-gym's ``entry["answer"]``; ``""`` when the task has none).
* ``entry``: the whole reasoning-gym entry (question, answer, metadata) serialized with :func:`encode_entry`; some
  verifiers read ``metadata``, whose nested, mixed-type values a ``datasets`` column cannot hold reliably.
  :func:`decode_entry` restores it exactly (tuples and sets included).
* ``task``: the reasoning-gym task name, so the reward functions know which verifier to use.
* ``problem_id``: ``"<task>:<seed>:<index>"``, a stable per-problem key (e.g. for the drafter's per-problem history).
"""

from __future__ import annotations

import json
from typing import Any

import datasets

DEFAULT_TASK = "gsm_symbolic"

#: System prompt for small instruct models (SmolLM2-135M-Instruct): short reasoning, answer in ``<answer>`` tags,
#: which :mod:`das_trl.defaults.rewards` extracts and scores.
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Think step by step, briefly. "
    "Then give only the final answer inside <answer> and </answer> tags, for example: <answer>42</answer>"
)

#: System prompt of the main job (``recipes/configs/embedded_default.yaml``: 1-digit reasoning-gym ``products``):
#: asks for the computation as an equation, which :func:`das_trl.defaults.rewards.equation_reward` rewards. With it the
#: packaged SmolLM2-135M-Instruct answered 49% of 128 sampled 1-digit products right (35% with
#: ``DEFAULT_SYSTEM_PROMPT``, 31% with none), and every 8-sample group had reward variance (benchmarks/NOTES.md,
#: "Choosing the main job's task").
ARITHMETIC_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer with the calculation and its result, for example: 3 * 4 = 12"
)

_RG_PREFIX = "rg:"


def reasoning_gym_tasks() -> list[str]:
    """Names of the registered reasoning-gym tasks, sorted."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _check_task(task: str) -> None:
    tasks = reasoning_gym_tasks()
    if task not in tasks:
        examples = ", ".join(t for t in ("gsm_symbolic", "basic_arithmetic", "chain_sum", "countdown", "codeio") if t in tasks)
        raise ValueError(
            f"Unknown reasoning-gym task {task!r}. Valid tasks include {examples} "
            f"({len(tasks)} in all; see das_trl.defaults.data.reasoning_gym_tasks())."
        )


# --- entry serialization --------------------------------------------------------------------------------------------
# JSON alone turns tuples into lists, and some verifiers compare metadata tuples (arc_agi, rearc score 1.0 on the
# original entry but 0.05 after a plain JSON round trip). Tag tuples and sets so the round trip is exact.


def _to_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _to_jsonable(v) for k, v in obj.items()}
        return {"__dict_items__": [[_to_jsonable(k), _to_jsonable(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_to_jsonable(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {"__set__": [_to_jsonable(v) for v in sorted(obj, key=repr)]}
    if isinstance(obj, list):
        return [_to_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return _to_jsonable(obj.tolist())
    return repr(obj)


def _from_jsonable(obj: dict) -> Any:
    if len(obj) == 1:
        if "__tuple__" in obj:
            return tuple(obj["__tuple__"])
        if "__set__" in obj:
            return set(obj["__set__"])
        if "__dict_items__" in obj:
            return {_hashable(k): v for k, v in obj["__dict_items__"]}
    return obj


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def encode_entry(entry: dict[str, Any]) -> str:
    """Serialize a reasoning-gym entry to a JSON string that :func:`decode_entry` restores exactly.

    Tuples, sets and dicts with non-string keys are tagged; numpy values become lists/scalars; any other object
    becomes its ``repr`` (no verifier in reasoning-gym needs those).
    """
    return json.dumps(_to_jsonable(entry), ensure_ascii=False)


def decode_entry(text: str) -> dict[str, Any]:
    """Inverse of :func:`encode_entry`. Raises ``json.JSONDecodeError`` / ``TypeError`` on malformed input."""
    return json.loads(text, object_hook=_from_jsonable)


# --- datasets --------------------------------------------------------------------------------------------------------


def _messages(question: str, system_prompt: str | None) -> list[dict[str, str]]:
    messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    messages.append({"role": "user", "content": question})
    return messages


def load_reasoning_gym_dataset(
    task: str = DEFAULT_TASK,
    size: int = 64,
    seed: int = 0,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    task_config: dict[str, Any] | None = None,
) -> datasets.Dataset:
    """Generate ``size`` problems of a reasoning-gym task as a TRL-ready conversational prompt dataset.

    Args:
        task: a reasoning-gym task name (see :func:`reasoning_gym_tasks`), e.g. ``"gsm_symbolic"``,
            ``"basic_arithmetic"``, ``"chain_sum"``. Uses the task's default difficulty configuration.
        size: number of problems.
        seed: generation seed; the same ``(task, size, seed)`` always gives the same dataset.
        system_prompt: system message prepended to every prompt; ``None`` for user-only prompts.
        task_config: options of the task's reasoning-gym config class, e.g. ``{"min_terms": 2, "max_terms": 2,
            "min_digits": 1, "max_digits": 1}`` for an easy ``chain_sum``. Default: the task's defaults.

    Returns:
        A ``datasets.Dataset`` with columns ``prompt``, ``answer``, ``entry``, ``task``, ``problem_id`` (see the
        module docstring), ready for ``GRPOTrainer(train_dataset=...)`` with
        :func:`das_trl.defaults.rewards.correctness_reward` and :func:`das_trl.defaults.rewards.format_reward`.

    Raises:
        ValueError: unknown task, ``size < 1``, or a ``task_config`` the task rejects.
    """
    _check_task(task)
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    import reasoning_gym

    try:
        rg_dataset = reasoning_gym.create_dataset(task, size=size, seed=seed, **(task_config or {}))
    except (TypeError, AssertionError) as error:
        raise ValueError(f"Invalid task_config {task_config!r} for reasoning-gym task {task!r}: {error}") from error
    rows: dict[str, list] = {"prompt": [], "answer": [], "entry": [], "task": [], "problem_id": []}
    for index in range(size):
        entry = rg_dataset[index]
        answer = entry.get("answer")
        rows["prompt"].append(_messages(str(entry["question"]), system_prompt))
        rows["answer"].append("" if answer is None else str(answer))
        rows["entry"].append(encode_entry(entry))
        rows["task"].append(task)
        rows["problem_id"].append(f"{task}:{seed}:{index}")
    return datasets.Dataset.from_dict(rows)


def is_reasoning_gym_name(name: str) -> bool:
    """True when :func:`load_prompt_dataset` would route ``name`` to reasoning-gym (``rg:<task>`` or a bare task)."""
    return name.startswith(_RG_PREFIX) or name in reasoning_gym_tasks()


def load_prompt_dataset(
    name: str = DEFAULT_TASK,
    *,
    size: int = 64,
    seed: int = 0,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    split: str = "train",
    config: str | None = None,
    task_config: dict[str, Any] | None = None,
    prompt_column: str | None = None,
    **load_kwargs: Any,
) -> datasets.Dataset:
    """Load a prompt dataset by name: reasoning-gym without a hub, ``datasets.load_dataset`` otherwise.

    Args:
        name: ``"rg:<task>"`` or a bare reasoning-gym task name (``"gsm_symbolic"``) -> :func:`load_reasoning_gym_dataset`
            (an unknown task after ``rg:`` raises ``ValueError``). Anything else ->
            ``datasets.load_dataset(name, config, split=split, **load_kwargs)``: a hub dataset
            (``load_prompt_dataset("openai/gsm8k", config="main", prompt_column="question")``), a local path, or a
            builder such as ``"json"`` with ``data_files=...``.
        size, seed, task_config: reasoning-gym only (see :func:`load_reasoning_gym_dataset`).
        system_prompt: the system message, for reasoning-gym and for ``prompt_column``.
        split: ``datasets`` only: the split to load.
        config: ``datasets`` only: the dataset configuration name (``load_dataset``'s second argument).
        prompt_column: ``datasets`` only. ``None`` (default): return the dataset unchanged (TRL needs a ``prompt``
            column; the reward functions in :mod:`das_trl.defaults.rewards` need ``answer`` and ``entry`` and only
            apply to reasoning-gym data). A column name: build a conversational ``prompt`` column from that text
            column (with ``system_prompt``), keeping the other columns.

    Returns:
        ``datasets.Dataset``.
    """
    if is_reasoning_gym_name(name):
        task = name[len(_RG_PREFIX):] if name.startswith(_RG_PREFIX) else name
        return load_reasoning_gym_dataset(
            task, size=size, seed=seed, system_prompt=system_prompt, task_config=task_config
        )

    dataset = datasets.load_dataset(name, config, split=split, **load_kwargs)
    if prompt_column is not None:
        if prompt_column not in dataset.column_names:
            raise ValueError(f"prompt_column {prompt_column!r} not in dataset columns {dataset.column_names}")

        def to_prompt(example: dict[str, Any]) -> dict[str, Any]:
            return {"prompt": _messages(str(example[prompt_column]), system_prompt)}

        drop = ["prompt"] if "prompt" in dataset.column_names and prompt_column != "prompt" else []
        dataset = dataset.remove_columns(drop).map(to_prompt)
    return dataset
