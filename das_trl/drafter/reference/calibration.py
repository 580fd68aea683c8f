"""Online calibration of estimated acceptance probabilities from verification outcomes.

Why. The evidence model of ``arbitration.py`` (a_i = p_i * n/(n+kappa) * m/(m+mu)) is a prior: how often a draft
token is really accepted depends on the sampling temperature, on how far the policy has drifted from the history, and
on the source (a per-problem tree built from 8 samples is right more often than its count ratio says; a global tree
drafting into a T = 1.0 rollout much less often). The engine verifies every draft, so the drafter learns this: DAS is
distribution-aware, and the acceptance it observes on the run's own rollouts is the most direct measurement of the
current distribution there is.

How. Cells are (source, match-length bucket, bin of the prior a_i). Each verified draft token i adds its prior a_i to
its cell's ``expected`` mass and 1 to ``hits`` when it was accepted (a chain draft is accepted up to its first
mismatch, so token i is accepted iff ``i < num_accepted``; a_i is the probability of that event, as arctic's
probabilities are cumulative). The calibrated estimate is a_i * (hits + s) / (expected + s): the observed/predicted
ratio, shrunk to 1 by ``s`` pseudo-observations so that an empty cell keeps the prior.

Forgetting. A cell whose estimate falls below the drafting threshold is no longer drafted from, so it gets no new
observations. :meth:`AcceptanceCalibrator.new_step` (called by the drafter at every history push, i.e. once per GRPO
step) multiplies all counts by ``step_decay``: such a cell drifts back towards the evidence model within a few steps
and is tried again, and the correction follows a policy whose acceptance changes in either direction. Counts are
also halved when a cell's mass passes ``cap`` within a step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sources import MATCH_BUCKETS, match_bucket

_BUCKET_OF = [match_bucket(m) for m in range(MATCH_BUCKETS[-1] + 1)]  # lookup table for the hot path


class AcceptanceCalibrator:
    """Per-(source, match-length bucket, prior-probability bin) ratio of observed to predicted accepted draft tokens.

    Args:
        sources: source names (``das_trl.drafter.sources.SOURCE_ORDER``); unknown names are rejected with ``KeyError``.
        bins: equal-width bins of the prior a in [0, 1] (int >= 1).
        pseudocount: s, pseudo-observations at ratio 1 (float > 0).
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
        rows = len(self._index) * (len(MATCH_BUCKETS) + 1)
        # Plain Python lists, not numpy: calibrate() and observe() run per draft on the engine's critical path, where a
        # numpy scalar access costs ~0.1-0.3 us.
        self._expected = [[0.0] * self.bins for _ in range(rows)]
        self._hits = [[0.0] * self.bins for _ in range(rows)]
        self._ratios = [[1.0] * self.bins for _ in range(rows)]
        self.observed_tokens = 0

    @property
    def expected(self) -> np.ndarray:
        """Predicted accepted tokens per cell, ``float64 [sources * match buckets, bins]`` (a copy)."""
        return np.array(self._expected)

    @property
    def hits(self) -> np.ndarray:
        """Accepted tokens per cell, same shape as :attr:`expected` (a copy)."""
        return np.array(self._hits)

    def _bin(self, a: float) -> int:
        return min(self.bins - 1, max(0, int(a * self.bins)))

    def _row(self, source: str, match_len: int) -> int:
        nb = len(MATCH_BUCKETS) + 1
        return self._index[source] * nb + (_BUCKET_OF[match_len] if match_len < len(_BUCKET_OF) else nb - 1)

    def ratio(self, source: str, match_len: int, a: float) -> float:
        """Observed / predicted acceptance of the cell holding prior ``a`` (1.0 with no observations)."""
        return self._ratios[self._row(source, match_len)][self._bin(a)]

    def calibrate(self, source: str, match_len: int, prior: Sequence[float], floor: float = 0.0) -> list[float]:
        """Calibrated acceptance estimates for one draft: ``min(1, a_i * ratio)``, made non-increasing along the
        draft (token i+1 can only be accepted if token i is). ``prior``: the a_i, chain order; ``match_len``: context
        tokens the draft's tree matched. The list stops before the first estimate below ``floor`` (the drafting
        threshold: the rest would be cut anyway)."""
        ratios = self._ratios[self._row(source, match_len)]
        nbins, top = self.bins, self.bins - 1
        out, last = [], 1.0
        for a in prior:
            b = int(a * nbins)
            c = a * ratios[b if b < top else top]
            if c < last:
                if c < floor:
                    break
                last = c
            out.append(last)
        return out

    def observe(self, source: str, match_len: int, prior: Sequence[float], num_accepted: int) -> None:
        """Record one verified draft: ``prior`` are the a_i of the tokens drafted, the first ``num_accepted`` of
        them were accepted (clipped to ``[0, len(prior)]``)."""
        s = self._row(source, match_len)
        expected, hits, ratios = self._expected[s], self._hits[s], self._ratios[s]
        n_acc = min(max(int(num_accepted), 0), len(prior))
        top, pc = self.bins - 1, self.pseudocount
        for i, a in enumerate(prior):
            b = min(top, max(0, int(a * self.bins)))
            expected[b] += a
            if i < n_acc:
                hits[b] += 1.0
            if expected[b] > self.cap:
                expected[b] *= 0.5
                hits[b] *= 0.5
            ratios[b] = (hits[b] + pc) / (expected[b] + pc)
        self.observed_tokens += len(prior)

    def new_step(self) -> None:
        """Multiply every count by ``step_decay`` (call once per training step; see the module docstring)."""
        d, pc = self.step_decay, self.pseudocount
        for expected, hits, ratios in zip(self._expected, self._hits, self._ratios):
            for b in range(self.bins):
                expected[b] *= d
                hits[b] *= d
                ratios[b] = (hits[b] + pc) / (expected[b] + pc)

    def table(self) -> dict[str, list[list[float]]]:
        """Current ratios: source -> [match bucket][prior bin] (for logs and docs)."""
        nb = len(MATCH_BUCKETS) + 1
        return {name: [[round(x, 3) for x in self._ratios[i * nb + m]] for m in range(nb)]
                for name, i in self._index.items()}
