"""Caps on a step's drafts: the controller's ``step_token_cap`` (smallest marginal gains first,
:func:`apply_step_cap`), the engine's token budget (far positions first, :func:`cap_step_tokens`) and, where vLLM's
verification logprobs are padded to the longest draft, the longest draft that pays for its padding
(:func:`cap_longest_draft`).

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


def cap_longest_draft(useful: np.ndarray, lengths: np.ndarray, value_ms: np.ndarray, token_ms: float,
                      c_logprob_ms: float, num_rows: int) -> np.ndarray:
    """The step's drafts cut to the longest length ``L`` that pays for vLLM's padded logprob path.

    vLLM's ``RejectionSampler._get_logprobs_tensors`` (0.32 / 0.33.0, unpatched) log-softmaxes ``num_rows x (L + 1)``
    rows for a step whose longest draft is ``L``. With each verified position already charged ``token_ms`` (its
    forward share and its own row), the padding costs ``c_logprob_ms x (num_rows x L - sum_i min(len_i, L))`` more,
    so raising ``L`` by one costs ``c_logprob_ms`` for every row that does not draft that far. Position ``j`` of row
    ``i`` is worth ``max(useful[i, j] x value_ms[i] - token_ms, 0)`` (its expected saving net of its own
    verification, as :func:`apply_step_cap`; a kept position whose linear gain is below 0, which the cut's cost per
    token of progress may keep at the end of a draft, counts as 0: keeping it is the cut's decision, and only the
    padding cuts here); ``L`` maximises the sum over the kept positions minus the padding, ties going to the longer
    ``L``. So the kept drafts' expected saving is never below their padding (``L = 0`` costs and saves nothing), and
    nothing is cut where there is no padding (one row, or every row drafting ``L``) or ``c_logprob_ms`` is 0.

    Args:
        useful: ``float64 [m, K]`` per-position acceptance estimates of the drafted rows (non-increasing).
        lengths: ``int [m]`` their kept draft tokens.
        value_ms: ``float64 [m]`` ms one token of progress is worth to each row (:func:`optimal_draft_lengths`).
        token_ms / c_logprob_ms: ms per verified token (``c_tok + c_logprob``) / per logprob row.
        num_rows: the step's rows (``>= m``: every running request, drafted or not).

    Returns:
        ``int32 [m]``: ``min(lengths, L)`` (``lengths`` itself, as int32, when nothing is cut).
    """
    lengths = np.asarray(lengths, dtype=np.int32)
    top = int(lengths.max(initial=0))
    if top == 0 or c_logprob_ms <= 0:
        return lengths
    reach = np.arange(top)[None, :] < lengths[:, None]              # [m, top] position kept before the cap
    gain = np.maximum(useful[:, :top] * np.asarray(value_ms)[:, None] - token_ms, 0.0) + c_logprob_ms
    # raising the cap from l to l + 1: the gains of position l of the rows that reach it, minus a logprob row for
    # every row of the step (the rows reaching it got theirs back above: each was charged in token_ms already)
    step_gain = np.where(reach, gain, 0.0).sum(axis=0) - c_logprob_ms * num_rows
    total = np.concatenate(([0.0], np.cumsum(step_gain)))
    best = int(np.flatnonzero(total >= total.max() - 1e-12)[-1])
    return lengths if best == top else np.minimum(lengths, best).astype(np.int32)
