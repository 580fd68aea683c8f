"""Parsing and checking of the bench commands' structured options (JSON config overrides, ``--ngram``, epoch lists).

Errors are ``ValueError`` (the ``das-trl bench`` command prints them as one line with exit code 2) or, for the
``type=`` functions, ``argparse.ArgumentTypeError`` (argparse's own usage error, exit code 2 as well).
"""

from __future__ import annotations

import argparse
import dataclasses
import json


def json_overrides(text: str | None, option: str, config: type) -> dict:
    """The JSON object ``text`` given as ``option``: overrides of the dataclass ``config``'s fields (``{}`` for none).

    Raises:
        ValueError: ``text`` is not JSON, not a JSON object, or has a key that is not a field of ``config`` (the
            message names the unknown keys and lists the valid ones).
    """
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option} is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{option} must be a JSON object of {config.__name__} fields, e.g. '{{\"name\": value}}', "
                         f"got {type(value).__name__}: {text!r}")
    fields = [f.name for f in dataclasses.fields(config)]
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise ValueError(f"{option}: unknown {config.__name__} field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))}; valid fields: {', '.join(fields)}")
    return value


def ngram_spec(text: str) -> tuple[int, int, int]:
    """``--ngram`` as ``(prompt_lookup_min, prompt_lookup_max, num_speculative_tokens)``.

    Raises:
        argparse.ArgumentTypeError: not three comma-separated ints with ``1 <= min <= max`` and ``k >= 1``.
    """
    parts = text.split(",")
    try:
        lo, hi, k = (int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be MIN,MAX,K (three ints: prompt_lookup_min, prompt_lookup_max, "
                                         f"num_speculative_tokens), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {text!r}")
    if k < 1:
        raise argparse.ArgumentTypeError(f"num_speculative_tokens must be >= 1, got {text!r}")
    return lo, hi, k


def epoch_list(text: str) -> list[int]:
    """A comma-separated list of distinct epoch indices (``--train-epochs``), in the order given.

    Raises:
        argparse.ArgumentTypeError: an entry is not an int >= 0, or an epoch is listed twice.
    """
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated epoch indices, e.g. 0,1,2, got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"must be comma-separated epoch indices >= 0, got {text!r}")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"lists an epoch twice: {text!r}")
    return out
