"""The gate, before drafting: which rows can pay for a draft at all, and how long to draft them
(``docs/budget.md``, "Counting the proposer's CPU")."""

from __future__ import annotations

import numpy as np

#: No draft is longer (the native core's MAX_SPEC_TOKENS): larger hard caps count as this in the gate.
MAX_CAP = 64
#: The least chance of sending a draft the gate divides a row's proposer CPU by (the native kMinSend).
MIN_SEND = 0.05
#: The fewest draft tokens :func:`draft_caps` gives a drafted row (the native kMinDraftCap).
MIN_DRAFT_CAP = 4


def gate_rows(weight_ms: np.ndarray, q: np.ndarray, caps: np.ndarray, c_tok_ms: float,
              draft_row_ms: float | np.ndarray, draft_margin: float = 0.0) -> np.ndarray:
    """Which rows can pay for being drafted at all, decided before drafting (cheap: no draft, no survival).

    Row ``i`` drafting ``d`` tokens with per-token acceptance ``q_i`` emits ``1 + S_d`` tokens per round,
    ``S_d = q + q^2 + ... + q^d``, and costs ``c_tok (1 + (1 + margin) d) + draft_row_ms`` more per round than
    ``c_tok`` (its own verification and the proposer's CPU for the row); not drafting costs ``weight + c_tok`` per
    token of progress. Drafting pays iff some ``d`` in ``1 .. caps[i]`` has
    ``c_tok (1 + margin) d + draft_row_ms < (weight + c_tok) S_d`` (the cost per token of progress falls).

    Args:
        weight_ms: ``float64 [n]`` ``c_base * P_i`` (what a round of row ``i`` adds to the makespan's cost).
        q: ``float64 [n]`` predicted per-token acceptance in ``[0, 1)``.
        caps: ``int [n]`` most draft tokens row ``i`` may get (0: never drafted; above :data:`MAX_CAP`: that).
        c_tok_ms / draft_row_ms: ms per verified token / ms of proposer CPU per drafted row (a number, or
            ``float64 [n]`` one per row).

    Returns:
        ``bool [n]``.
    """
    caps = np.asarray(caps)
    if caps.dtype.kind not in "iu":  # any integer dtype compares exactly; others as before (truncated to int64)
        caps = caps.astype(np.int64)
    q = np.maximum(np.asarray(q, dtype=np.float64), 0.0)  # np.clip(q, 0, 0.999) in two ufunc calls
    np.minimum(q, 0.999, out=q)
    value = np.asarray(weight_ms, dtype=np.float64) + c_tok_ms
    # S_d < q / (1 - q) and the cost is smallest at d = 1: rows failing that bound are out without the [n, K] work
    # (in a large batch where nothing pays, that is every row).
    out = (value * q / (1.0 - q) > c_tok_ms * (1.0 + draft_margin) + draft_row_ms) & (caps > 0)
    rows = out.nonzero()[0]
    m = len(rows)
    if m:
        per_row = np.ndim(draft_row_ms) > 0
        if m < len(out):
            q, value, caps = q[rows], value[rows], caps[rows]
            if per_row:
                draft_row_ms = np.asarray(draft_row_ms)[rows]
        k = min(int(np.maximum.reduce(caps)), MAX_CAP)
        d = _arange_1(k)
        s_d = (q[:, None] ** d).cumsum(axis=1)  # [m, k]
        cost = c_tok_ms * (1.0 + draft_margin) * d + (np.asarray(draft_row_ms)[:, None] if per_row else draft_row_ms)
        ok = value[:, None] * s_d > cost
        ok &= d <= caps[:, None]
        out[rows] = np.logical_or.reduce(ok, axis=1)
    return out


def draft_caps(weight_ms: np.ndarray, q: np.ndarray, caps: np.ndarray, c_tok_ms: float, ratio: float = 1.0,
               draft_margin: float = 0.0) -> np.ndarray:
    """How many tokens to draft for rows the gate drafts, before drafting: a row's per-token value of progress is
    at most ``weight + c_tok`` (its cost per token without a draft), so a draft position whose estimate (after the
    cut's ``acceptance_ratio`` correction) is below ``floor = c_tok (1 + margin) / (ratio' (weight + c_tok))``, with
    ``ratio' = max(ratio, 1)``, can never pay; a draft of per-token acceptance ``q`` stays above it for
    ``log(floor) / log(q)`` positions, and drafts vary around the row's average, so the cap allows twice that:
    ``ceil(2 log(floor) / log(q))``, at least :data:`MIN_DRAFT_CAP`, at most ``caps``. In a large batch (small
    weights) rows draft a few tokens; the rows likely to set the makespan draft up to their hard cap. Drafting
    cost grows with the length walked in each source, on the engine's critical path.

    Args:
        weight_ms / q: ``float64 [n]`` as :func:`gate_rows`.
        caps: ``int [n]`` hard caps (above :data:`MAX_CAP`: that).
        c_tok_ms / ratio / draft_margin: ms per verified token, :attr:`BudgetController.acceptance_ratio`,
            ``ControllerConfig.draft_margin``.

    Returns:
        ``int32 [n]``, each in ``[min(caps, MIN_DRAFT_CAP), caps]``.
    """
    caps = np.minimum(np.asarray(caps), MAX_CAP).astype(np.int64)  # clamp first: uint64 2**63 wraps in int64
    qi = np.minimum(np.maximum(np.asarray(q, dtype=np.float64), 0.0), 0.999)
    floor = c_tok_ms * (1.0 + draft_margin) / ((np.asarray(weight_ms, dtype=np.float64) + c_tok_ms) * max(ratio, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        reach = 2.0 * np.log(floor) / np.log(qi)
    ok = (floor < 1.0) & (qi > 0.0)
    out = np.where(ok & ~(reach < caps), caps,
                   np.minimum(caps, np.maximum(MIN_DRAFT_CAP, np.ceil(np.where(ok, reach, 0.0)))))
    out = np.where(ok, out, np.minimum(caps, MIN_DRAFT_CAP))
    return out.astype(np.int32)


_ARANGE_1: dict[int, np.ndarray] = {}


def _arange_1(k: int) -> np.ndarray:
    """``float64 [k]`` ``1, 2, .., k`` (cached per ``k``; read only)."""
    d = _ARANGE_1.get(k)
    if d is None:
        d = np.arange(1, k + 1, dtype=np.float64)
        d.flags.writeable = False
        if len(_ARANGE_1) < 256:
            _ARANGE_1[k] = d
    return d
