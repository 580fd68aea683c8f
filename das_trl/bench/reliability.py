"""Predicted vs realised acceptance of the draft tokens sent for verification, per draft position and source.

The budget controller keeps a draft position only where its acceptance estimate pays for the token's verification,
so the estimates must hold at every position it may keep, far ones included. A replay records, for every token a
drafted row sent, the estimate the controller decided on (``BudgetController.predicted_acceptance``: the drafter's
calibrated cumulative estimate x the chance the position lies before the request's end x the controller's own
correction) and the drafter's own estimate (``DraftBatch.accept``), and whether verification accepted it (position
``j`` of a draft with ``a`` accepted tokens is accepted iff ``j < a``: acceptance is a prefix). Sums are kept per
position (1 .. :data:`MAX_POSITION`) and source, and reported per position bucket (:data:`POSITION_BUCKETS`).

A well-calibrated estimate has mean predicted = realised rate in every bucket. Selection makes this hard: the cut
keeps the positions with the highest estimates, so an estimate that is noisy but unbiased overall is optimistic
about the kept ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from das_trl.drafter.sources import SOURCE_ORDER

#: Position buckets (1-based draft positions, inclusive) the report groups by.
POSITION_BUCKETS = ((1, 4), (5, 16), (17, 32), (33, 64))
#: Positions past the last bucket (drafts are at most this long natively) count in the last bucket.
MAX_POSITION = 64
#: Buckets with fewer sent tokens than this are reported but not held to a calibration target.
MIN_BUCKET_TOKENS = 500


def bucket_of(position: int) -> int:
    """Index into :data:`POSITION_BUCKETS` of a 1-based draft position (positions past 64 count as 64)."""
    if position < 1:
        raise ValueError(f"draft positions are 1-based, got {position}")
    for i, (_, hi) in enumerate(POSITION_BUCKETS):
        if position <= hi:
            return i
    return len(POSITION_BUCKETS) - 1


_BUCKET_OF = np.array([bucket_of(p) for p in range(1, MAX_POSITION + 1)], np.int64)


@dataclass
class ReliabilityRecord:
    """Running sums over sent draft tokens, per source (``SOURCE_ORDER``) and 1-based position (1 .. 64).

    Attributes:
        tokens: ``int64 [S, 64]`` draft tokens sent.
        predicted: ``float64 [S, 64]`` the sum of the controller's estimates for them.
        drafter: ``float64 [S, 64]`` the sum of the drafter's own (calibrated) estimates.
        accepted: ``int64 [S, 64]`` how many were accepted.
    """

    tokens: np.ndarray = field(default_factory=lambda: np.zeros((len(SOURCE_ORDER), MAX_POSITION), np.int64))
    predicted: np.ndarray = field(default_factory=lambda: np.zeros((len(SOURCE_ORDER), MAX_POSITION)))
    drafter: np.ndarray = field(default_factory=lambda: np.zeros((len(SOURCE_ORDER), MAX_POSITION)))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros((len(SOURCE_ORDER), MAX_POSITION), np.int64))
    _pending: dict = field(default_factory=dict, repr=False)

    def add(self, source: int, predicted: Sequence[float], drafter: Sequence[float], num_accepted: int) -> None:
        """One verified draft: ``predicted`` / ``drafter`` ``float [n]`` the estimates of its ``n`` sent tokens (the
        cumulative probability that positions ``1 .. j + 1`` are all accepted), ``num_accepted`` in ``[0, n]``.

        Raises:
            ValueError: a source outside ``SOURCE_ORDER``, estimates of different lengths or outside ``[0, 1]``, or
                ``num_accepted`` outside ``[0, n]``.
        """
        p = np.asarray(predicted, np.float64).reshape(-1)
        d = np.asarray(drafter, np.float64).reshape(-1)
        n = len(p)
        if not 0 <= int(source) < len(SOURCE_ORDER):
            raise ValueError(f"source must index SOURCE_ORDER (0..{len(SOURCE_ORDER) - 1}), got {source}")
        if len(d) != n or not 0 <= int(num_accepted) <= n:
            raise ValueError(f"need as many drafter estimates as predicted ({n}, got {len(d)}) and 0 <= accepted <= "
                             f"{n}, got {num_accepted}")
        if n and not (p.min() >= 0.0 and p.max() <= 1.0 and d.min() >= 0.0 and d.max() <= 1.0):
            raise ValueError("estimates must lie in [0, 1]")
        if n == 0:
            return
        pos = np.minimum(np.arange(n), MAX_POSITION - 1)  # positions past 64 fold into the last column
        s = int(source)
        np.add.at(self.tokens[s], pos, 1)
        np.add.at(self.predicted[s], pos, p)
        np.add.at(self.drafter[s], pos, d)
        np.add.at(self.accepted[s], pos[: int(num_accepted)], 1)

    def sent(self, key: object, source: int, predicted: np.ndarray, drafter: np.ndarray) -> None:
        """A draft sent for verification under ``key`` (e.g. a request id), waiting for :meth:`verified`."""
        self._pending[key] = (int(source), np.array(predicted, np.float64), np.array(drafter, np.float64))

    def verified(self, key: object, num_sent: int, num_accepted: int) -> None:
        """The verification of the draft sent under ``key``: ``num_sent`` of its tokens were verified (the rest, if
        any, were never scheduled), ``num_accepted`` accepted. Unknown keys are ignored (nothing was sent)."""
        item = self._pending.pop(key, None)
        if item is None or num_sent <= 0:
            return
        source, p, d = item
        n = min(int(num_sent), len(p))
        self.add(source, p[:n], d[:n], min(max(int(num_accepted), 0), n))

    def merge(self, other: "ReliabilityRecord") -> None:
        """Add another record's sums into this one."""
        for name in ("tokens", "predicted", "drafter", "accepted"):
            getattr(self, name).__iadd__(getattr(other, name))

    def buckets(self, source: int | None = None) -> list[dict]:
        """Per position bucket (:data:`POSITION_BUCKETS`): ``positions`` ("1-4", ...), ``tokens``, the mean
        ``predicted`` (controller) and ``drafter`` estimates, the ``realised`` acceptance rate (``None`` where no
        token was sent), and ``gap`` = predicted - realised. ``source``: one source, else all of them."""
        rows = slice(None) if source is None else slice(int(source), int(source) + 1)
        out = []
        for b, (lo, hi) in enumerate(POSITION_BUCKETS):
            cols = _BUCKET_OF == b
            n = int(self.tokens[rows][:, cols].sum())
            pred = float(self.predicted[rows][:, cols].sum())
            drf = float(self.drafter[rows][:, cols].sum())
            acc = int(self.accepted[rows][:, cols].sum())
            out.append({"positions": f"{lo}-{hi}", "tokens": n, "predicted": pred / n if n else None,
                        "drafter": drf / n if n else None, "realised": acc / n if n else None,
                        "gap": (pred - acc) / n if n else None})
        return out

    def to_dict(self) -> dict:
        """JSON-serialisable summary: ``buckets`` (all sources), ``by_source`` (name -> buckets, sources that sent
        anything), and ``per_position`` (``tokens`` / ``predicted`` / ``realised`` per position 1 .. 64, all
        sources; means, ``None`` where nothing was sent)."""
        tok = self.tokens.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            pred = self.predicted.sum(axis=0) / tok
            real = self.accepted.sum(axis=0) / tok
        return {"buckets": self.buckets(),
                "by_source": {name: self.buckets(s) for s, name in enumerate(SOURCE_ORDER) if self.tokens[s].any()},
                "per_position": {"tokens": tok.tolist(),
                                 "predicted": [None if t == 0 else float(x) for t, x in zip(tok, pred)],
                                 "realised": [None if t == 0 else float(x) for t, x in zip(tok, real)]}}


def worst_gap(summary: dict, min_tokens: int = MIN_BUCKET_TOKENS) -> float | None:
    """The largest ``|predicted - realised|`` over the buckets of a :meth:`ReliabilityRecord.to_dict` summary (all
    sources and each source) with at least ``min_tokens`` sent tokens; ``None`` when no bucket has that many."""
    gaps = [abs(b["gap"]) for b in summary.get("buckets", []) if b["tokens"] >= min_tokens]
    for buckets in summary.get("by_source", {}).values():
        gaps += [abs(b["gap"]) for b in buckets if b["tokens"] >= min_tokens]
    return max(gaps) if gaps else None


#: Buckets with fewer sent tokens than this are left out of the reliability figure (their rates are noise).
MIN_PLOT_TOKENS = 100


def write_reliability_plot(points: Sequence[tuple[str, dict]], path: str | Path) -> Path:
    """One reliability figure: per replay point (``(name, ReliabilityRecord.to_dict())``), the controller's mean
    predicted acceptance and the realised rate per draft position bucket (solid: realised, dashed: predicted; buckets
    with fewer than :data:`MIN_PLOT_TOKENS` sent tokens left out). Returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9.0, 4.2))
    labels = [f"{lo}-{hi}" for lo, hi in POSITION_BUCKETS]
    x = np.arange(len(labels))
    for i, (name, rel) in enumerate(points):
        b = rel.get("buckets", [])
        if not b:
            continue
        real = [np.nan if r["tokens"] < MIN_PLOT_TOKENS else r["realised"] for r in b]
        pred = [np.nan if r["tokens"] < MIN_PLOT_TOKENS else r["predicted"] for r in b]
        color = f"C{i % 10}"
        ax.plot(x, real, "-o", color=color, label=name)
        ax.plot(x, pred, "--x", color=color)
    ax.set_xticks(x, labels)
    ax.set_xlabel("draft position (bucket)")
    ax.set_ylabel("acceptance of sent tokens")
    ax.set_ylim(0.0, 1.0)
    ax.set_title("Controller's predicted (dashed) vs realised (solid) acceptance")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: the same data, the same bytes
    plt.close(fig)
    return path


def format_reliability(rows: Sequence[tuple[str, dict]], min_tokens: int = MIN_BUCKET_TOKENS) -> str:
    """A table of ``(label, ReliabilityRecord.to_dict())`` rows: per position bucket, sent tokens and the
    controller's mean predicted vs realised acceptance; ``worst`` = the largest ``|gap|`` over buckets (all sources and
    each source) with at least ``min_tokens`` tokens."""
    head = f"{'point':<44}" + "".join(f"{f'{lo}-{hi}':>22}" for lo, hi in POSITION_BUCKETS) + f"{'worst':>8}"
    lines = [f"predicted (controller) / realised acceptance of sent draft tokens [tokens]; worst |gap| over buckets "
             f"with >= {min_tokens} tokens (all sources and per source)", head, "-" * len(head)]
    for label, rel in rows:
        cells = []
        for b in rel.get("buckets", []):
            cells.append(f"{'-':>22}" if not b["tokens"] else
                         f"{b['predicted']:>7.3f}/{b['realised']:.3f} [{b['tokens']:>6}]")
        worst = worst_gap(rel, min_tokens)
        lines.append(f"{label:<44}" + "".join(cells) + (f"{worst:>8.3f}" if worst is not None else f"{'-':>8}"))
    return "\n".join(lines)
