"""The cut, after drafting: per row, the draft length that minimises the cost per token of progress
(``docs/budget.md``, "The value of progress")."""

from __future__ import annotations

import numpy as np


def optimal_draft_lengths(accept: np.ndarray, weight_ms: np.ndarray, c_tok_ms: float,
                          draft_margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the draft length minimising the cost per token of progress (``docs/budget.md``).

    Args:
        accept: ``float64 [n, K]`` cumulative acceptance estimates (non-increasing along a row; 0 past the draft).
        weight_ms: ``float64 [n]`` ``c_base * P_i``: what one round of row ``i`` adds to the makespan's cost.
        c_tok_ms: ms per verified token.

    Returns:
        ``(lengths, value)``: ``int32 [n]`` in ``[0, K]``, and ``float64 [n]`` the value (ms) of one token of
        progress at that length, ``V_i = (weight_i + c_tok (1 + d_i)) / tau_i(d_i)``.
    """
    n, k = accept.shape
    tau = np.empty((n, k + 1))
    tau[:, 0] = 1.0
    np.cumsum(accept, axis=1, out=tau[:, 1:])
    tau[:, 1:] += 1.0
    per_round = weight_ms[:, None] + c_tok_ms * (1.0 + (1.0 + draft_margin) * np.arange(k + 1, dtype=np.float64))[None, :]
    ratio = per_round / tau
    # Ties (e.g. acceptance exactly 1 with nothing to gain) go to the shorter draft, whatever the rounding.
    d = (ratio * (1.0 + 1e-9 * np.arange(k + 1))[None, :]).argmin(axis=1)
    value = ratio[np.arange(n), d]
    return d.astype(np.int32), value
