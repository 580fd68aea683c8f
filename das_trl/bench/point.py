"""A replay point of the suite: one rollout file replayed at one appearance, with its results per cost model.

Filled by ``das-trl bench suite`` (:func:`das_trl.bench.suite.run_point`), read by the report
(:mod:`das_trl.bench.report`): its own module, so the report stands below the command that fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from das_trl.bench.simulation import Bounds, ReplayResult


@dataclass
class Point:
    """One replay point: a file replayed at one appearance, with its results per cost model."""

    name: str
    path: str
    eval_epoch: int
    history_epochs: list[int]
    requests: int
    problems: int
    tokens: int
    results: dict[float, list[ReplayResult]] = field(default_factory=dict)  # c_tok -> results in drafter order
    bounds: Bounds | None = None  # oracle-trim (from das+siblings) and oracle-text
    # another engine (another verification shape, admission) -> c_tok -> none (suffix) and the default under it
    variants: dict[str, dict[float, list[ReplayResult]]] = field(default_factory=dict)
