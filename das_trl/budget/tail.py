"""Who finishes last and which draft positions outlive the request, from sampled remaining lengths
(``docs/budget.md``, "Who finishes last")."""

from __future__ import annotations

import numpy as np


def tail_probability(rounds: np.ndarray, bins: int = 64) -> tuple[np.ndarray, float]:
    """Probability that each row needs the most rounds, from sampled rounds to finish.

    Counting how often each row is the sample maximum resolves nothing below ``1 / S`` (a row never the maximum
    in 64 samples would get exactly 0, and at cheap verification a 1 % chance of being last is worth drafting for).
    Instead each row's samples give its distribution over ``bins`` log-spaced bins, and
    ``P_i = sum_g pmf_i(g) * prod_{j != i} mid_j(g)`` with ``mid_j(g) = P(R_j < g) + pmf_j(g) / 2`` (a row in the
    same bin is below with probability one half), in O(n bins); the result is normalised to sum to 1.

    Args:
        rounds: ``float64 [n, S]`` sampled rounds to finish per row (n >= 1, values >= 0).
        bins: grid size.

    Returns:
        ``(P, makespan)``: ``float64 [n]``, and the expected maximum over the samples (rounds until the last request
        finishes). Rows cut at the same ``max_tokens`` tie and share ``P`` equally.
    """
    n, s = rounds.shape
    makespan = float(rounds.max(axis=0).mean())
    if n == 1:
        return np.ones(1), makespan
    x = np.log1p(np.maximum(rounds, 0.0))
    top = float(x.max())
    b = np.zeros(x.shape, np.int64) if top <= 0 else np.minimum((x * (bins / top)).astype(np.int64), bins - 1)
    pmf = np.bincount((np.arange(n)[:, None] * bins + b).ravel(), minlength=n * bins).reshape(n, bins) / s
    mid = np.cumsum(pmf, axis=1) - 0.5 * pmf
    zero = mid <= 0.0
    logmid = np.log(np.where(zero, 1.0, mid))
    total = logmid.sum(axis=0)  # [bins]: log prod over the rows with mid > 0
    zeros = zero.sum(axis=0)    # [bins]: rows with mid == 0 (a row's own sample bins always have mid > 0)
    # sum_g pmf_i(g) f(g) is the mean of f over row i's own samples: evaluate the product at their bins only.
    others = np.where(zeros[b] == 0, np.exp(total[b] - np.take_along_axis(logmid, b, axis=1)), 0.0)
    p = others.mean(axis=1)
    tot = p.sum()
    return (p / tot if tot > 0 else np.full(n, 1.0 / n)), makespan


def survival(remaining: np.ndarray, k: int) -> np.ndarray:
    """``float64 [n, k]``: column ``j`` is the share of row ``i``'s samples with more than ``j + 1`` tokens to go,
    i.e. the probability that draft position ``j`` is not past the request's end (the token after an accepted
    draft is always the round's own, so position ``j`` needs ``j + 2`` remaining tokens). ``remaining``:
    ``float64 [n, S]``. One ``bincount``, O(n S)."""
    n, s = remaining.shape
    if k <= 0 or n == 0:
        return np.ones((n, max(k, 0)))
    v = np.minimum(np.floor(remaining), k + 1).astype(np.int64)
    hist = np.bincount((np.arange(n)[:, None] * (k + 2) + v).ravel(), minlength=n * (k + 2)).reshape(n, k + 2)
    return 1.0 - np.cumsum(hist, axis=1)[:, 1:k + 1] / s
