"""Recorded rollouts as JSONL: the replay benchmark's input, written by the trainer (``das_record_rollouts``).

One JSON object per line (one rollout = one completion of one prompt)::

    {"step": 3, "epoch": 1.5, "problem_key": 1234567890123, "prompt_ids": [1, 9690, ...],
     "completion_ids": [504, 3012, ...], "finish_reason": "stop"}

- ``step``: the trainer's global step whose generation produced the rollout (int, from 0).
- ``epoch``: the trainer's fractional epoch at that step (float) — rollouts of one problem in one epoch form one
  appearance.
- ``problem_key``: :func:`das_trl.drafter.problem_key` of ``prompt_ids`` (int, 0 <= key < 2**63).
- ``prompt_ids`` / ``completion_ids``: token ids (lists of int).
- ``finish_reason``: ``"stop"`` (ended with EOS / a stop token) or ``"length"`` (hit ``max_completion_length``).

Only numpy and the standard library: the format is read by the drafter-level replay benchmark.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from das_trl.drafter.problem_key import problem_key as compute_problem_key


@dataclass
class RolloutRecord:
    """One recorded rollout (see the module docstring for the fields)."""

    step: int
    epoch: float
    problem_key: int
    prompt_ids: list[int]
    completion_ids: list[int]
    finish_reason: str

    @classmethod
    def make(cls, step: int, epoch: float, prompt_ids: Sequence[int], completion_ids: Sequence[int],
             finish_reason: str) -> "RolloutRecord":
        """Build a record, computing ``problem_key`` from the prompt."""
        return cls(int(step), float(epoch), compute_problem_key(prompt_ids), [int(t) for t in prompt_ids],
                   [int(t) for t in completion_ids], finish_reason)


def append_records(path: str | Path, records: Sequence[RolloutRecord]) -> None:
    """Append records to a JSONL file (created with its parent directory if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")


def read_records(path: str | Path) -> Iterator[RolloutRecord]:
    """Yield the records of a JSONL file, gzip-compressed or not (recognised by its magic bytes, whatever the name:
    recorded sets are committed as ``*.jsonl.gz``).

    Raises:
        ValueError: a line is not a valid record (the message gives the line number).
    """
    path = Path(path)
    with path.open("rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if compressed else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                yield RolloutRecord(int(data["step"]), float(data["epoch"]), int(data["problem_key"]),
                                    [int(t) for t in data["prompt_ids"]], [int(t) for t in data["completion_ids"]],
                                    str(data["finish_reason"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: not a rollout record: {exc}") from None
