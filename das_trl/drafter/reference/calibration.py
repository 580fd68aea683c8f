"""Online calibration of estimated acceptance probabilities from verification outcomes.

Why. The evidence model of ``arbitration.py`` (a_i = p_i * n/(n+kappa) * m/(m+mu)) is a prior: how often a draft
token is really accepted depends on the sampling temperature, on how far the policy has drifted from the history, on
the source (a per-problem tree built from 8 samples is right more often than its count ratio says; a global tree
drafting into a T = 1.0 rollout much less often) and on how far into the draft the token lies (a tree path seen in
every history sample says "certain" for 60 tokens; a sampled rollout leaves it within a few). The engine verifies
every draft, so the drafter learns this: DAS is distribution-aware, and the acceptance it observes on the run's own
rollouts is the most direct measurement of the current distribution there is.

How. A chain draft is accepted up to its first mismatch, so the chance that its first i + 1 tokens hold is the
product of each token's chance given that the ones before it held. The prior of token i given the earlier ones is
r_0 = a_0 and r_i = a_i / a_{i-1} (the tree's count ratio; arctic's probabilities are cumulative). Cells are
(source, match-length bucket, draft-position bucket, bin of r_i). Each verified draft teaches the tokens up to and
including its first rejected one (the later ones were never tried): token i adds r_i to its cell's ``expected`` mass
and 1 to ``hits`` when accepted. A cell's ratio is ``(hits + s R) / (expected + s)``: shrunk by ``s``
pseudo-observations towards R, the ratio of its (source, position bucket) parent, itself ``(H + s R') / (E + s)``
over all the parent's tokens with R' the parent ratio of the position bucket before (1 before the first): a rarely
seen cell takes its position's pooled correction, and a position bucket few drafts have reached yet the one before
it (acceptance falls along a draft; an untried far position is not "certain" because the tree says so). The calibrated estimate of
token i is ``min(1, r_i * ratio)``, and the draft's cumulative estimates are their running products (non-increasing
by construction).

Forgetting. A cell whose estimate falls below the drafting threshold is no longer drafted from, so it gets no new
observations. :meth:`AcceptanceCalibrator.new_step` (called by the drafter at every history push, i.e. once per GRPO
step) multiplies all counts by ``step_decay``: such a cell drifts back towards its parent and the evidence model
within a few steps and is tried again, and the correction follows a policy whose acceptance changes in either
direction. Counts are also halved when a cell's (or a parent's) mass passes ``cap`` within a step.

The native core's ``calibrator.h`` is a port with the same arithmetic in the same order (drafts compare equal).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sources import MATCH_BUCKETS, POSITION_BUCKETS, match_bucket, position_bucket

_BUCKET_OF = [match_bucket(m) for m in range(MATCH_BUCKETS[-1] + 1)]  # lookup tables for the hot path
_POSITION_OF = [position_bucket(i) for i in range(POSITION_BUCKETS[-1] + 1)]
_NUM_POSITIONS = len(POSITION_BUCKETS) + 1


class AcceptanceCalibrator:
    """Per-(source, match-length bucket, draft-position bucket, conditional-prior bin) ratio of observed to
    predicted accepted draft tokens, shrunk towards the (source, position bucket) ratio (see the module docstring).

    Args:
        sources: source names (``das_trl.drafter.sources.SOURCE_ORDER``); unknown names are rejected with ``KeyError``.
        bins: equal-width bins of the conditional prior r in [0, 1] (int >= 1).
        pseudocount: s, pseudo-observations at the parent's ratio (float > 0).
        cap: a cell's expected mass at which its counts are halved (float > pseudocount).
        step_decay: factor applied to all counts by :meth:`new_step` (float in [0, 1]; 1 = never forget).

    Not thread-safe (the drafter locks).
    """

    def __init__(self, sources: Sequence[str], bins: int = 10, pseudocount: float = 8.0, cap: float = 2000.0,
                 step_decay: float = 0.5) -> None:
        if bins < 1 or pseudocount <= 0 or cap <= pseudocount or not 0.0 <= step_decay <= 1.0:
            raise ValueError(f"AcceptanceCalibrator: need bins >= 1, pseudocount > 0, cap > pseudocount, "
                             f"0 <= step_decay <= 1; got {bins}, {pseudocount}, {cap}, {step_decay}")
        self.step_decay = float(step_decay)
        self._index = {s: i for i, s in enumerate(sources)}
        self.bins = int(bins)
        self.pseudocount = float(pseudocount)
        self.cap = float(cap)
        rows = len(self._index) * (len(MATCH_BUCKETS) + 1) * _NUM_POSITIONS
        parents = len(self._index) * _NUM_POSITIONS
        # Plain Python lists, not numpy: calibrate() and observe() run per draft on the engine's critical path, where a
        # numpy scalar access costs ~0.1-0.3 us.
        self._expected = [[0.0] * self.bins for _ in range(rows)]
        self._hits = [[0.0] * self.bins for _ in range(rows)]
        self._parent_expected = [0.0] * parents
        self._parent_hits = [0.0] * parents
        self.observed_tokens = 0

    @property
    def expected(self) -> np.ndarray:
        """Predicted accepted tokens per cell, ``float64 [sources * match buckets * position buckets, bins]`` (a
        copy)."""
        return np.array(self._expected)

    @property
    def hits(self) -> np.ndarray:
        """Accepted tokens per cell, same shape as :attr:`expected` (a copy)."""
        return np.array(self._hits)

    def _bin(self, r: float) -> int:
        b = int(r * self.bins)
        return b if b < self.bins - 1 else self.bins - 1

    def _row(self, source: str, match_len: int, position: int) -> int:
        nb = len(MATCH_BUCKETS) + 1
        m = _BUCKET_OF[match_len] if match_len < len(_BUCKET_OF) else nb - 1
        return (self._index[source] * nb + m) * _NUM_POSITIONS + self._position(position)

    def _parent(self, source: str, position: int) -> int:
        return self._index[source] * _NUM_POSITIONS + self._position(position)

    @staticmethod
    def _position(i: int) -> int:
        return _POSITION_OF[i] if i < len(_POSITION_OF) else _NUM_POSITIONS - 1

    @staticmethod
    def _conditional(prior: Sequence[float], i: int) -> float:
        if i == 0:
            return min(max(prior[0], 0.0), 1.0)
        before = prior[i - 1]
        if not before > 0.0:
            return 0.0
        return min(max(prior[i] / before, 0.0), 1.0)

    def _parent_ratio(self, source: str, bucket: int, before: float) -> float:
        p = self._index[source] * _NUM_POSITIONS + bucket
        return (self._parent_hits[p] + self.pseudocount * before) / (self._parent_expected[p] + self.pseudocount)

    def _up(self, source: str, bucket: int) -> float:
        """The chained parent ratio of position bucket ``bucket`` (see the module docstring)."""
        up = 1.0
        for p in range(bucket + 1):
            up = self._parent_ratio(source, p, up)
        return up

    def _shrunk(self, row: int, b: int, up: float) -> float:
        return (self._hits[row][b] + self.pseudocount * up) / (self._expected[row][b] + self.pseudocount)

    def ratio(self, source: str, match_len: int, position: int, r: float) -> float:
        """The ratio applied to conditional prior ``r`` of 0-based draft ``position`` (1.0 with no observations)."""
        up = self._up(source, self._position(position))
        return self._shrunk(self._row(source, match_len, position), self._bin(r), up)

    def calibrate(self, source: str, match_len: int, prior: Sequence[float], floor: float = 0.0) -> list[float]:
        """Calibrated cumulative acceptance estimates for one draft: the running product of ``min(1, r_i * ratio)``
        (non-increasing). ``prior``: the cumulative a_i, chain order; ``match_len``: context tokens the draft's tree
        matched. The list stops before the first estimate below ``floor`` (the drafting threshold: the rest would be
        cut anyway)."""
        out, last = [], 1.0
        pos, up = -1, 1.0  # the position bucket `up` (its chained parent ratio) is for
        for i in range(len(prior)):
            r = self._conditional(prior, i)
            want = self._position(i)
            while pos < want:
                pos += 1
                up = self._parent_ratio(source, pos, up)
            c = r * self._shrunk(self._row(source, match_len, i), self._bin(r), up)
            if c > 1.0:
                c = 1.0
            a = last * c
            if a < floor:
                break
            out.append(a)
            last = a
        return out

    def observe(self, source: str, match_len: int, prior: Sequence[float], num_accepted: int) -> None:
        """Record one verified draft: ``prior`` are the cumulative a_i of the tokens drafted, the first
        ``num_accepted`` of them were accepted (clipped to ``[0, len(prior)]``); the tokens up to and including the
        first rejected one are learned from."""
        n = len(prior)
        n_acc = min(max(int(num_accepted), 0), n)
        cap = self.cap
        for i in range(min(n_acc + 1, n)):
            r = self._conditional(prior, i)
            row, parent, b = self._row(source, match_len, i), self._parent(source, i), self._bin(r)
            hit = 1.0 if i < n_acc else 0.0
            expected, hits = self._expected[row], self._hits[row]
            expected[b] += r
            hits[b] += hit
            if expected[b] > cap:
                expected[b] *= 0.5
                hits[b] *= 0.5
            self._parent_expected[parent] += r
            self._parent_hits[parent] += hit
            if self._parent_expected[parent] > cap:
                self._parent_expected[parent] *= 0.5
                self._parent_hits[parent] *= 0.5
        self.observed_tokens += n

    def new_step(self) -> None:
        """Multiply every count by ``step_decay`` (call once per training step; see the module docstring)."""
        d = self.step_decay
        for expected, hits in zip(self._expected, self._hits):
            for b in range(self.bins):
                expected[b] *= d
                hits[b] *= d
        for i in range(len(self._parent_expected)):
            self._parent_expected[i] *= d
            self._parent_hits[i] *= d

    def table(self) -> dict[str, list[list[list[float]]]]:
        """Current ratios: source -> [match bucket][position bucket][conditional-prior bin] (for logs and docs)."""
        nb = len(MATCH_BUCKETS) + 1
        return {name: [[[round(self._shrunk((i * nb + m) * _NUM_POSITIONS + p, b, self._up(name, p)), 3)
                         for b in range(self.bins)] for p in range(_NUM_POSITIONS)] for m in range(nb)]
                for name, i in self._index.items()}
