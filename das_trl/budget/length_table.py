"""Per-problem completion lengths as dense arrays, gathered per batch row for the budget controller.

The controller needs, for every running request, the lengths its problem's recent completions reached (the windowed
history) to estimate how much longer the request will run. This table keeps the last ``max_lengths`` lengths of each
problem and serves a whole step's rows with one vectorised lookup (``np.searchsorted`` over the sorted problem keys),
so the per-step path has no per-request Python loop and no dictionary inside the controller.

numpy and the standard library only.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

#: Padding value of :meth:`LengthTable.gather` rows (below every real length, so ``row > generated`` skips it).
PAD = -1.0


class LengthTable:
    """Recent completion lengths (tokens) per problem, plus a pooled quantile table over all problems.

    Args:
        max_lengths: lengths kept per problem, most recent (int >= 1); older ones drop out as new ones arrive.
        global_quantiles: size of the pooled table used for problems without history (int >= 2).

    Thread safety: a history push (``observe`` then ``prepare``, on the pushing thread) may run while an engine step
    calls ``gather``: each build is published in one assignment and ``gather`` reads one build whole (a push's lengths
    reach the steps that start after its build). Other concurrent calls are not supported.
    """

    def __init__(self, max_lengths: int = 64, global_quantiles: int = 64) -> None:
        if max_lengths < 1 or global_quantiles < 2:
            raise ValueError(f"LengthTable: need max_lengths >= 1 and global_quantiles >= 2, got {max_lengths}, "
                             f"{global_quantiles}")
        self.max_lengths = int(max_lengths)
        self.global_quantiles = int(global_quantiles)
        self._lengths: dict[int, deque] = {}
        self._dirty = True
        # (sorted keys, the keys with one extra entry (-1, never a key past the last one) so a miss is one comparison,
        # the table and counts with one extra all-PAD row (index len(keys)) that unknown keys gather, the pooled
        # quantiles): published together in one assignment, so a gather on the engine's thread reads one build whole
        # while a history push (another thread) builds the next (prepare).
        self._built = (np.zeros(0, np.int64), np.full(1, -1, np.int64), np.full((1, 1), PAD, np.float64),
                       np.zeros(1, np.int64), np.zeros(0, np.float64))

    def __len__(self) -> int:
        return len(self._lengths)

    def observe(self, problem_key: int, lengths: Sequence[int]) -> None:
        """Add one appearance's completion lengths (tokens; zeros ignored) of a problem.

        Raises:
            ValueError: ``problem_key`` not an int in ``[0, 2**63)`` or a negative length.
        """
        key = int(problem_key)
        if not 0 <= key < 2**63:
            raise ValueError(f"LengthTable.observe: problem_key must be in [0, 2**63), got {problem_key!r}")
        arr = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if arr.size and int(arr.min()) < 0:
            raise ValueError(f"LengthTable.observe: lengths must be >= 0, got min {int(arr.min())}")
        arr = arr[arr > 0]
        if not arr.size:
            return
        dq = self._lengths.get(key)
        if dq is None:
            dq = self._lengths[key] = deque(maxlen=self.max_lengths)
        dq.extend(arr.tolist())
        self._dirty = True

    def lengths(self, problem_key: int) -> np.ndarray:
        """The kept lengths of a problem (``int64``, oldest first; empty if unknown)."""
        dq = self._lengths.get(int(problem_key))
        return np.fromiter(dq, np.int64) if dq else np.zeros(0, np.int64)

    def _rebuild(self) -> None:
        # Cleared before the snapshot: an observe() racing with this build marks the table dirty again after it.
        self._dirty = False
        items = [(k, list(dq)) for k, dq in list(self._lengths.items())]  # list() of a dict / deque: one C call each
        keys = np.fromiter((k for k, _ in items), np.int64, len(items))
        order = np.argsort(keys)
        # As wide as the most lengths a problem holds (<= max_lengths), not max_lengths: the rows are right-aligned
        # and every reader counts from the right (the lengths above g are a suffix), so the padding columns a wider
        # table adds change nothing but the bytes each engine step's gather copies and each kernel scans.
        w = max((len(v) for _, v in items), default=1)
        table = np.full((len(keys) + 1, w), PAD, np.float64)  # + the unknown keys' row
        counts = np.zeros(len(keys) + 1, np.int64)
        for row, j in enumerate(order.tolist()):  # once per history push, not per engine step
            vals = np.sort(np.asarray(items[j][1], np.float64))
            table[row, w - len(vals):] = vals  # ascending, padding first
            counts[row] = len(vals)
        pooled = table[table > PAD]
        glob = np.quantile(pooled, np.linspace(0.0, 1.0, self.global_quantiles)) if pooled.size else \
            np.zeros(0, np.float64)
        sorted_keys = keys[order]
        self._built = (sorted_keys, np.append(sorted_keys, -1), table, counts, glob)

    def prepare(self) -> None:
        """Sort what :meth:`observe` added into the dense table now (a no-op when nothing was added), so that the
        next :meth:`gather` finds it built: the controller calls it at the end of a history push, which runs between
        generation rounds, instead of leaving the rebuild (~3-5 ms at a few hundred problems) to the first engine
        step after the push, on the engine's critical path."""
        if self._dirty:
            self._rebuild()

    def gather(self, problem_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's problem lengths.

        Args:
            problem_keys: ``int64 [n]`` (or any integer array) problem key per row.

        Returns:
            ``(table, counts, pooled)``: ``float64 [n, W]`` lengths sorted ascending per row, the row's
            ``counts[i]`` lengths in its last columns and :data:`PAD` before them (all :data:`PAD` for an unknown
            problem), ``W`` the most lengths any problem holds (``1 <= W <= max_lengths``); ``int64 [n]`` counts;
            ``float64 [global_quantiles]`` ascending quantiles of all problems' kept lengths pooled (empty before any
            history), the fallback for unknown problems. ``table`` and ``counts`` are new arrays (the caller may
            modify them); ``pooled`` is the table's own (read it only).

        Cost: a handful of numpy calls on ``[n]`` / ``[n, W]`` arrays (one binary search, one row gather), no
        per-row Python; the sorted table is rebuilt here only when :meth:`observe` added lengths since the last build
        and :meth:`prepare` did not build it already.
        """
        if self._dirty:
            self._rebuild()
        keys = np.asarray(problem_keys, dtype=np.int64)
        if keys.ndim != 1:
            keys = keys.reshape(-1)
        # Sorted search; a key not in the table (including one past the last key: the -1 sentinel) gets the extra
        # all-PAD row with count 0.
        known, known_ext, table, counts, pooled = self._built  # one build, whole
        pos = known.searchsorted(keys)
        np.putmask(pos, known_ext[pos] != keys, len(known))
        return table.take(pos, axis=0), counts[pos], pooled

    def stats(self) -> dict:
        """``problems`` known and ``lengths`` kept (all problems)."""
        return {"problems": len(self._lengths), "lengths": int(sum(len(d) for d in self._lengths.values()))}
