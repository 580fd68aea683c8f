"""Caps on a step's total draft tokens: the controller's ``step_token_cap`` (smallest marginal gains first,
:func:`apply_step_cap`) and the engine's token budget (far positions first, :func:`cap_step_tokens`).

vLLM's scheduler counts draft tokens against ``max_num_batched_tokens`` (``vllm/v1/core/sched/scheduler.py``,
``Scheduler.schedule``: a running request is given ``min(tokens with its drafts, token budget left)`` tokens, its
draft is cut to fit, and a request that finds the budget spent waits for the next step). Drafts the scheduler would
cut are verification the controller paid CPU for and planned on, and rows that wait lose a whole step: the
controller therefore never offers more tokens than the budget holds.
"""

from __future__ import annotations

import numpy as np


def cap_step_tokens(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Cut per-row draft lengths so that their total is at most ``budget``, far positions first: every row is cut
    to a common length ``L`` (the largest whose total fits) and the rest of the budget gives one more token to the
    first rows still longer than ``L``. Far positions are the least likely to be accepted, so they go first.

    Args:
        lengths: ``int [m]`` draft tokens per row (>= 0).
        budget: most draft tokens in all (< 0 counts as 0).

    Returns:
        ``int32 [m]``: ``0 <= out[i] <= lengths[i]``, ``out.sum() <= max(budget, 0)``; ``lengths`` itself (as int32)
        when it fits.
    """
    kept = np.asarray(lengths).astype(np.int32, copy=False)
    budget = max(int(budget), 0)
    if int(kept.sum()) <= budget:
        return kept
    # the largest common length L with sum(min(kept, L)) <= budget (binary search over 0 .. max)
    lo, hi = 0, int(kept.max())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.minimum(kept, mid).sum()) <= budget:
            lo = mid
        else:
            hi = mid - 1
    out = np.minimum(kept, lo).astype(np.int32)
    extra = budget - int(out.sum())
    if extra > 0:
        longer = np.flatnonzero(kept > lo)[:extra]
        out[longer] += 1
    return out


def apply_step_cap(accept: np.ndarray, lengths: np.ndarray, value_ms: np.ndarray, c_tok_ms: float,
                   cap: int) -> np.ndarray:
    """Cut the step's total draft tokens to ``cap``, dropping the smallest marginal gains ``accept * V - c_tok``
    first (each row stays a prefix: gains are non-increasing along a row). ``lengths``: ``int [n]``; returns a new
    ``int32 [n]``; unchanged when ``cap <= 0`` or the total fits."""
    lengths = np.asarray(lengths, dtype=np.int32)
    total = int(lengths.sum())
    if cap <= 0 or total <= cap:
        return lengths.copy()
    n, k = accept.shape
    mask = np.arange(k)[None, :] < lengths[:, None]
    gain = accept * value_ms[:, None] - c_tok_ms
    vals = gain[mask]
    kth = np.partition(vals, len(vals) - cap)[len(vals) - cap]
    keep = mask & (gain > kth)
    ties = np.flatnonzero((mask & (gain == kth)).ravel())[: cap - int(keep.sum())]
    keep.ravel()[ties] = True
    return keep.sum(axis=1).astype(np.int32)
