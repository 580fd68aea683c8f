"""Constant ``int32`` rows handed to the drafter every engine step, without a new array per step."""

from __future__ import annotations

import numpy as np


class FilledViews:
    """``views(value, n)``: ``int32 [n]`` all ``value`` (e.g. 0: no budget, -1: whole draft verified, 1: one sampled
    token per row), a read-only view of a buffer kept per value across steps; the same view object while ``n`` holds
    (a new array per step cost ~1.3 us). Each buffer grows by doubling (at least 64 entries), so memory is bounded by
    twice the largest ``n`` asked for, per value."""

    def __init__(self) -> None:
        self._fills: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # value -> (read-only buffer, last view)

    def __call__(self, value: int, n: int) -> np.ndarray:
        buf, view = self._fills.get(value, (None, None))
        if view is None or len(view) != n:
            if buf is None or len(buf) < n:
                buf = np.full(max(n, 2 * (len(buf) if buf is not None else 0), 64), value, np.int32)
                buf.flags.writeable = False  # shared by every step: nothing may write to it
            view = buf[:n]
            self._fills[value] = (buf, view)
        return view
