"""The data sets a replay reads: rollout files found on disk, grouped into epochs (a problem's k-th appearance), and
split into history epochs and the epoch to replay.

Files are JSONL (or ``.jsonl.gz``) in the format of :mod:`das_trl.drafter.rollout_log` (the trainer's
``das_record_rollouts``, :mod:`das_trl.bench.micro.record`): the product's own recordings in ``benchmarks/sets/``, the
third-party sets in ``../shared/realdata/``.
"""

from __future__ import annotations

import gzip
import math
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from das_trl.drafter.rollout_log import RolloutRecord, read_records
from das_trl.drafter.tokens import TOKEN_LIMIT


def find_sets(paths: Sequence[str | Path]) -> list[Path]:
    """Every ``*.jsonl`` / ``*.jsonl.gz`` file under the given folders (files are taken as they are), sorted.

    Raises:
        FileNotFoundError: a path does not exist (for a realdata folder the message says how to fetch the sets), or
            no rollout file was found at all.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            hint = ""
            if any("realdata" in part.lower() for part in p.parts):  # e.g. ../shared/realdata on a fresh machine
                # the script runs from the checkout's root: an absolute --out, the folder (not a file in it)
                folder = (p.parent if set_name(p) != p.name else p).absolute()
                hint = (f"; the suite's third-party real-rollout sets can be fetched with `bash "
                        f"scripts/fetch_realdata.sh --out {folder}` (downloads them from their public sources, needs "
                        f"network; without --out they go to ~/.cache/das-trl/realdata, or $DAS_TRL_CACHE/realdata)")
            raise FileNotFoundError(f"--sets: {p} does not exist{hint}")
        if p.is_file():
            out.append(p)
        else:
            out += sorted(f for f in p.rglob("*") if f.is_file() and (f.name.endswith(".jsonl")
                                                                      or f.name.endswith(".jsonl.gz")))
    if not out:
        raise FileNotFoundError(f"--sets: no *.jsonl or *.jsonl.gz file under {', '.join(map(str, paths))}")
    return out


def set_name(path: Path) -> str:
    """Short name of a set: its file name without ``.jsonl`` / ``.jsonl.gz``."""
    name = path.name
    for ext in (".jsonl.gz", ".jsonl"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def load_epochs(path: str | Path, group_by: str = "appearance") -> dict[int, list[RolloutRecord]]:
    """Records grouped into epochs.

    ``group_by="appearance"`` (default): a record's epoch is the rank of its ``step`` among the steps in which its
    problem appears (a problem's k-th appearance is its epoch k), independent of how the trainer's fractional
    ``epoch`` is sampled (TRL reports it at the end of a step, e.g. 0.5 for the first of two steps per epoch).
    ``group_by="epoch"``: ``floor(epoch)`` (a tiny epsilon absorbs float noise).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is a directory or unreadable (a truncated .gz), a line is not a rollout record, or a
            record's token ids or problem key are out of range (the message names the file and the line), or
            ``group_by`` is unknown.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a rollouts file (*.jsonl or *.jsonl.gz)")
    try:
        records = list(read_records(path))
    except FileNotFoundError:
        raise
    except (EOFError, OSError, UnicodeDecodeError) as exc:  # a truncated or corrupt .gz, unreadable bytes
        raise ValueError(f"{path}: cannot read the rollouts file ({type(exc).__name__}: {exc})") from None
    # read_records checks the JSON shape only: out-of-range ids would fail later inside a drafter, naming the
    # position in a push instead of the line in the file.
    for index, r in enumerate(records):
        problem = _record_problem(r)
        if problem:
            raise ValueError(f"{path}:{_line_number(path, index)}: {problem}")
    out: dict[int, list[RolloutRecord]] = defaultdict(list)
    if group_by == "epoch":
        for r in records:
            out[int(math.floor(r.epoch + 1e-6))].append(r)
    elif group_by == "appearance":
        steps: dict[int, set[int]] = defaultdict(set)
        for r in records:
            steps[r.problem_key].add(r.step)
        rank = {key: {st: i for i, st in enumerate(sorted(v))} for key, v in steps.items()}
        for r in records:
            out[rank[r.problem_key][r.step]].append(r)
    else:
        raise ValueError(f"group_by must be 'appearance' or 'epoch', got {group_by!r}")
    return dict(sorted(out.items()))


def _record_problem(r: RolloutRecord) -> str | None:
    """What makes a parsed record unusable (None: nothing)."""
    if not 0 <= r.problem_key < 2**63:
        return f"problem_key must lie in [0, 2**63), got {r.problem_key}"
    for name, ids in (("prompt_ids", r.prompt_ids), ("completion_ids", r.completion_ids)):
        if ids and not (0 <= min(ids) and max(ids) < TOKEN_LIMIT):
            return f"{name} token ids must lie in [0, 2**31), got range [{min(ids)}, {max(ids)}]"
    return None


def _line_number(path: Path, index: int) -> int:
    """The line of ``path`` holding its ``index``-th record (read_records skips blank lines; gzip as it detects)."""
    with path.open("rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
    with (gzip.open if compressed else open)(path, "rt", encoding="utf-8") as f:
        seen = 0
        for number, line in enumerate(f, 1):
            if line.strip():
                if seen == index:
                    return number
                seen += 1
    raise AssertionError(f"{path} has no record {index}")


def split_epochs(epochs: dict[int, list[RolloutRecord]], train: Sequence[int] | None, eval_epoch: int | None):
    """The history epochs and the epoch to replay.

    Args:
        epochs: :func:`load_epochs` output.
        train: history epoch indices (``None``: every epoch before the replayed one).
        eval_epoch: the epoch to replay (``None``: the last).

    Returns:
        ``(history epochs' records, oldest first; the replayed epoch's records; history indices; replayed index)``.

    Raises:
        ValueError: fewer than 2 epochs without ``train``, an index that is not in ``epochs``, a history epoch listed
            twice, or one that is not before the replayed epoch (the replay drafts an epoch from the ones before it:
            the replayed epoch's own rollouts, or a later epoch's, in the history would leak what it is to draft).
    """
    keys = sorted(epochs)
    if len(keys) < 2 and train is None:
        raise ValueError(f"need at least 2 epochs to replay, found {keys}")
    ev = keys[-1] if eval_epoch is None else eval_epoch
    if ev not in epochs:
        raise ValueError(f"eval epoch {ev} not in the rollouts (epochs: {keys})")
    tr = [k for k in keys if k < ev] if train is None else sorted(train)  # history is fed oldest first
    for k in tr:
        if k not in epochs:
            raise ValueError(f"train epoch {k} not in the rollouts (epochs: {keys})")
    if len(set(tr)) != len(tr):
        raise ValueError(f"train epochs list an epoch twice: {list(train)}")
    late = [k for k in tr if k >= ev]
    if late:
        raise ValueError(f"train epochs {late} are not before the eval epoch {ev}: the replay drafts epoch {ev} "
                         f"from the epochs before it (history from epoch {ev} or later would leak what it drafts)")
    return [epochs[k] for k in tr], epochs[ev], tr, ev
