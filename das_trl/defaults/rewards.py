"""Default reward functions for reasoning-gym prompt datasets, in TRL's reward-function format.

TRL's ``GRPOTrainer`` calls each reward function as ``f(prompts=..., completions=..., completion_ids=...,
**columns, trainer_state=..., log_extra=..., log_metric=...)``, where ``columns`` are the dataset's extra columns
(one value per completion) and, for conversational data, each completion is a list of message dicts
(``[{"role": "assistant", "content": "..."}]``); for plain-text data it is a string. Both forms are accepted here.

The functions pair with :func:`das_trl.defaults.data.load_reasoning_gym_dataset`, whose ``entry`` and ``task``
columns they read. They never raise on malformed completions or entries: such items score ``0.0``.

Ranges:

* :func:`correctness_reward`: reasoning-gym's own verifier score, in ``[0.0, 1.0]``. ``1.0`` is correct; many tasks
  give small partial credit for a well-formed wrong answer (``gsm_symbolic``: ``0.01`` for a wrong number,
  ``0.0`` for no number at all), and ``0.0`` when nothing could be extracted.
* :func:`format_reward`: ``FORMAT_REWARD`` (``0.1``) when the completion contains a non-empty
  ``<answer>...</answer>`` block, else ``0.0``.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from das_trl.defaults.data import decode_entry

FORMAT_REWARD = 0.1

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def completion_text(completion: Any) -> str:
    """Text of one TRL completion: a string, or the concatenated ``content`` of a list of message dicts.

    Message contents may be strings or lists of ``{"type": "text", "text": ...}`` parts. Anything else gives ``""``.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return ""
    pieces: list[str] = []
    for message in completion:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            pieces.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(pieces)


def extract_answer(text: str) -> str | None:
    """The model's final answer in ``text``, or ``None``.

    Order: the content of the last non-empty ``<answer>...</answer>`` block; else the text after an unclosed final
    ``<answer>`` (a completion cut at the token limit); else the last number in the text (commas as thousands
    separators removed) -- a fallback that only helps numeric tasks.
    """
    if not isinstance(text, str):
        return None
    blocks = [b.strip() for b in _ANSWER_RE.findall(text)]
    blocks = [b for b in blocks if b]
    if blocks:
        return blocks[-1]
    start = text.lower().rfind("<answer>")
    if start >= 0:
        rest = text[start + len("<answer>"):]
        if "</answer>" not in rest.lower() and rest.strip():
            return rest.strip()
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return numbers[-1].replace(",", "")
    return None


@functools.lru_cache(maxsize=None)
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def _column(kwargs: dict[str, Any], key: str, n: int) -> list[Any]:
    values = kwargs.get(key)
    if values is None:
        return [None] * n
    if isinstance(values, (str, dict)):
        return [values] * n
    values = list(values)
    return values if len(values) == n else (values + [None] * n)[:n]


def _score_one(completion: Any, entry: Any, task: Any) -> float:
    try:
        if isinstance(entry, str):
            entry = decode_entry(entry)
        if not isinstance(entry, dict):
            return 0.0
        if not isinstance(task, str) or not task:
            task = (entry.get("metadata") or {}).get("source_dataset")
        if not isinstance(task, str):
            return 0.0
        answer = extract_answer(completion_text(completion))
        if answer is None:
            return 0.0
        score = float(_scorer(task)(answer, entry))
        if score != score:  # NaN
            return 0.0
        return min(max(score, 0.0), 1.0)
    except Exception:
        return 0.0


def correctness_reward(completions: list[Any], entry: list[Any] | None = None, task: list[Any] | None = None,
                       **kwargs: Any) -> list[float]:
    """Score each completion's extracted answer with reasoning-gym's verifier for its task.

    Args:
        completions: TRL completions (lists of message dicts, or strings).
        entry: the dataset's ``entry`` column (JSON strings from :func:`das_trl.defaults.data.encode_entry`, or
            entry dicts).
        task: the dataset's ``task`` column; when missing, ``entry["metadata"]["source_dataset"]`` is used.
        **kwargs: other columns and TRL's extras (ignored).

    Returns:
        One float in ``[0.0, 1.0]`` per completion (see the module docstring); ``0.0`` for anything malformed.
    """
    n = len(completions)
    entries = _column({"entry": entry}, "entry", n)
    tasks = _column({"task": task}, "task", n)
    return [_score_one(c, e, t) for c, e, t in zip(completions, entries, tasks)]


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """``FORMAT_REWARD`` (0.1) per completion holding a non-empty ``<answer>...</answer>`` block, else ``0.0``."""
    rewards = []
    for completion in completions:
        try:
            text = completion_text(completion)
            ok = any(block.strip() for block in _ANSWER_RE.findall(text))
            rewards.append(FORMAT_REWARD if ok else 0.0)
        except Exception:
            rewards.append(0.0)
    return rewards


DEFAULT_REWARD_FUNCS = [correctness_reward, format_reward]
