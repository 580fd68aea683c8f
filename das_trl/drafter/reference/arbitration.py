"""Evidence-weighted choice between draft candidates from several suffix trees.

Why not arctic's rule. arctic-inference's ``SuffixDecodingCache.speculate`` keeps the
draft with the highest ``score`` = sum of the tree's token probabilities. Those
probabilities are count ratios: a per-problem tree built from two samples gives
probability 1.0 to whatever it saw, so its score is maximal and it beats a global
tree whose continuation is backed by hundreds of sequences but branches a little
(probabilities 0.9...). DAS (arXiv 2511.13841, Sec. 2 of DESIGN.md) requires weighing
the evidence behind each candidate.

The rule. For a candidate with tree probabilities p_1..p_k (chain, cumulative as
arctic returns them), support n (distinct sequences of that source containing the
g-gram "last g-1 context tokens + first draft token", ``support.py``) and match
length m, the estimated acceptance probability of draft token i is

    a_i = p_i * n / (n + kappa) * m / (m + mu)

* ``n / (n + kappa)`` is the Laplace-style shrinkage of an empirical frequency
  estimated from n samples towards "unknown": 2 samples -> 0.5 (kappa = 2), 30
  samples -> 0.94. It saturates, so once a problem's own history has enough samples
  its sharper, problem-specific probabilities win over the global mixture.
* ``m / (m + mu)`` prefers candidates conditioned on more context (a 1-token match is
  often coincidence).

The draft is cut at the first a_i < ``min_token_prob``; the candidate with the largest
sum of a_i (expected accepted tokens under this model) wins. Ties go to the earlier
source in ``sources.SOURCE_ORDER`` (most specific first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .calibration import AcceptanceCalibrator


@dataclass
class Candidate:
    """One tree's draft for one request and round.

    Attributes:
        source: one of ``SOURCE_ORDER``.
        token_ids: draft tokens (list of int), chain order.
        probs: arctic's cumulative probability of each draft token (list of float).
        match_len: number of context tokens matched (int).
        support: sequences of this source supporting the first draft token (int >= 0).
        accept: estimated acceptance probabilities a_i (filled by :func:`evaluate`; calibrated when a calibrator
            is given).
        prior: the evidence model's a_i before calibration (filled by :func:`evaluate`; what the calibrator learns
            from once the draft is verified).
    """

    source: str
    token_ids: list[int]
    probs: list[float]
    match_len: int
    support: int
    accept: list[float] = field(default_factory=list)
    prior: list[float] = field(default_factory=list)

    @property
    def raw_score(self) -> float:
        """arctic's score: sum of tree probabilities (what a naive rule maximizes)."""
        return float(sum(self.probs))

    @property
    def score(self) -> float:
        """Evidence-weighted score: sum of ``accept`` (0 before :func:`evaluate`)."""
        return float(sum(self.accept))


def confidence(support: float, match_len: int, kappa: float, mu: float) -> float:
    """Multiplier n/(n+kappa) * m/(m+mu) in [0, 1) (see module docstring).

    ``n`` is floored at 1: a tree only returns a continuation some sequence contains, while the g-gram count can be
    0 when the match is shorter than g - 1 tokens (the gram then reaches into unmatched context). Counting such a
    candidate as unsupported discarded every 1-token match (replay, T = 1.0: 0.95x of vLLM suffix's tokens per
    round instead of 0.99x for the same sources)."""
    if match_len <= 0:
        return 0.0
    support = max(support, 1)
    return support / (support + kappa) * match_len / (match_len + mu)


def evaluate(cand: Candidate, kappa: float, mu: float, min_token_prob: float,
             truncate_by_evidence: bool = True, calibrator: "AcceptanceCalibrator | None" = None) -> Candidate:
    """Fill ``cand.prior`` (a_i of the evidence model) and ``cand.accept`` (the a_i, calibrated by ``calibrator``
    from verification outcomes when given, ``calibration.py``), and truncate the draft at the first accept
    a_i < ``min_token_prob`` (or, with ``truncate_by_evidence=False``, at the first raw tree probability
    p_i < ``min_token_prob``, arctic's rule; the estimates then only rank candidates).

    Returns the same (mutated) candidate.
    """
    conf = confidence(cand.support, cand.match_len, kappa, mu)
    prior = [p * conf for p in cand.probs]
    if calibrator is not None and prior:
        accept = calibrator.calibrate(cand.source, cand.match_len, prior,
                                      min_token_prob if truncate_by_evidence else 0.0)
    else:
        accept = prior
    n = 0
    for p, a in zip(cand.probs, accept):
        if (a if truncate_by_evidence else p) < min_token_prob or a <= 0.0:
            break
        n += 1
    cand.prior = prior[:n]
    cand.accept = accept[:n]
    del cand.token_ids[n:]
    del cand.probs[n:]
    return cand


def choose(cands: list[Candidate], kappa: float, mu: float, min_token_prob: float,
           truncate_by_evidence: bool = True, calibrator: "AcceptanceCalibrator | None" = None) -> Candidate | None:
    """Evaluate candidates and return the best non-empty one (largest sum of a_i), or ``None``.

    Args:
        cands: candidates in ``SOURCE_ORDER`` order (ties keep the earliest).
        kappa, mu, min_token_prob, truncate_by_evidence: see ``DrafterConfig``.
        calibrator: optional :class:`~das_trl.drafter.reference.calibration.AcceptanceCalibrator`.
    """
    best: Candidate | None = None
    for cand in cands:
        evaluate(cand, kappa, mu, min_token_prob, truncate_by_evidence, calibrator)
        if cand.accept and (best is None or cand.score > best.score):
            best = cand
    return best
