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
* :func:`equation_reward`: ``EQUATION_REWARD`` (``0.2``) when the completion shows a computation as an equation with a
  numeric result (``3 * 4 = 12``), else ``0.0``. Shaping for small models on arithmetic tasks (the main job's
  ``products``): SmolLM2-135M-Instruct never writes ``<answer>`` tags (0 of 384 sampled completions on three arithmetic
  tasks), so :func:`format_reward` gives it no signal, but it writes such an equation in ~30-45% of its answers, and
  those are right about twice as often (0.62-0.64 vs 0.24-0.36 on 1-digit products). It scores the format only;
  :func:`correctness_reward` scores the value.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from das_trl.defaults.data import decode_entry

FORMAT_REWARD = 0.1
EQUATION_REWARD = 0.2

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
# "<number> <operator> <number> = <number>" (a computation shown with its result).
_EQUATION_RE = re.compile(r"\d(?:\.\d+)?\s*[-+*/x×÷]\s*-?\d+(?:\.\d+)?\s*=\s*-?\d")


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


def equation_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """``EQUATION_REWARD`` (0.2) per completion showing a computation as an equation with a numeric result
    (``<number> <op> <number> = <number>``, op one of ``+ - * / x × ÷``; e.g. ``3 * 4 = 12``), else ``0.0``.

    Format only (a wrong result still gets it); pair it with :func:`correctness_reward`. Never raises: a malformed
    completion scores ``0.0``.
    """
    rewards = []
    for completion in completions:
        try:
            rewards.append(EQUATION_REWARD if _EQUATION_RE.search(completion_text(completion)) else 0.0)
        except Exception:
            rewards.append(0.0)
    return rewards


def _as_number(text: str) -> float | None:
    match = _NUMBER_RE.search(text.replace("$", ""))
    if match is None or match.group(0).replace(",", "") != text.replace("$", "").replace(",", "").strip():
        return None
    return float(match.group(0).replace(",", ""))


def reference_answer_reward(completions: list[Any], answer: list[Any] | None = None, **kwargs: Any) -> list[float]:
    """Exact-answer reward for hub data sets with a reference ``answer`` column (GSM8K style).

    The reference is the text after the last ``####`` when there is one (GSM8K's ``"... #### 72"``), else the whole
    value. The completion's answer is :func:`extract_answer`'s. Numbers compare numerically (``"1,000"`` equals
    ``"1000.0"``; a ``$`` is ignored), anything else as stripped, case-folded text.

    Returns:
        One float per completion: ``1.0`` for a match, else ``0.0`` (also when ``answer`` is missing).
    """
    references = _column({"answer": answer}, "answer", len(completions))
    rewards = []
    for completion, reference in zip(completions, references):
        if reference is None:
            rewards.append(0.0)
            continue
        gold = str(reference).rsplit("####", 1)[-1].strip()
        given = extract_answer(completion_text(completion))
        if given is None:
            rewards.append(0.0)
            continue
        gold_num, given_num = _as_number(gold), _as_number(given.strip())
        if gold_num is not None and given_num is not None:
            rewards.append(1.0 if abs(gold_num - given_num) < 1e-9 else 0.0)
        else:
            rewards.append(1.0 if given.strip().casefold() == gold.casefold() else 0.0)
    return rewards


DEFAULT_REWARD_FUNCS = [correctness_reward, format_reward]
