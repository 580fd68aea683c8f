"""Explicit problem ids from a dataset column (``das_problem_id``), for the drafter's per-problem history.

By default a rollout's problem is its (first-turn) prompt: the history is keyed by the hash of the prompt ids, and
the engine maps later turns of a multi-turn / tool-calling conversation to their first prompt
(:mod:`das_trl.drafter.conversation`). When the same problem is asked with different prompts (prompt augmentation,
shuffled few-shot examples, a system prompt that changes per epoch), give the dataset a ``das_problem_id`` column
(an int in ``[0, 2**63)`` or a string): the trainer pushes each rollout's history under that id instead, and the engine
maps the prompts it was pushed with (and their later turns) to it from the next step on.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: Dataset column holding an explicit problem id (TRL hands extra columns through to the trainer's inputs).
PROBLEM_ID_COLUMN = "das_problem_id"


def problem_id_key(value: Any) -> int:
    """The drafter key (``int`` in ``[0, 2**63)``) of one ``das_problem_id`` value.

    Args:
        value: a non-negative int below ``2**63`` (used as is) or a non-empty string (its blake2b-64 digest, top bit
            cleared: stable across processes).

    Raises:
        ValueError: any other value (bools, floats, negative or too large ints, empty strings, None).
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{PROBLEM_ID_COLUMN} values must be ints in [0, 2**63) or non-empty strings, got {value!r}")
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu"):
        key = int(value)
        if not 0 <= key < 2**63:
            raise ValueError(f"{PROBLEM_ID_COLUMN} ints must lie in [0, 2**63), got {key}")
        return key
    if isinstance(value, str) and value:
        digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)
    raise ValueError(f"{PROBLEM_ID_COLUMN} values must be ints in [0, 2**63) or non-empty strings, got {value!r}")


def problem_ids_of(inputs: list[Any]) -> list[int] | None:
    """The explicit keys of a batch of trainer inputs (dataset rows), or ``None`` when no row has the column.

    Raises:
        ValueError: some rows have the column and others do not, or a value is invalid (:func:`problem_id_key`).
    """
    values = [row.get(PROBLEM_ID_COLUMN) if isinstance(row, dict) else None for row in inputs]
    present = [v is not None for v in values]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"{PROBLEM_ID_COLUMN} is missing in {present.count(False)} of {len(values)} rows of a batch: "
                         "give every row an id (or drop the column to key problems by their prompt)")
    return [problem_id_key(v) for v in values]
