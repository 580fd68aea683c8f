"""One engine step's drafts for a batch of requests, as arrays (the drafter's batch output).

Both drafter backends (the Python reference and the native core) return this from ``propose_batch``; the budget
controller reads ``accept`` to decide how many of each row's draft tokens are worth verifying, and the vLLM proposer
turns ``tokens[:lengths]`` into vLLM's ``list[list[int]]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sources import SOURCE_ORDER

#: ``DraftBatch.source`` value of a row with no draft.
NO_SOURCE = -1


@dataclass
class DraftBatch:
    """Drafts of ``n`` requests for one verification round.

    Attributes:
        tokens: ``int32 [n, K]`` draft token ids, row ``i`` valid up to ``lengths[i]`` (the rest is padding, 0).
        lengths: ``int32 [n]`` draft length per row (0 = no draft), ``<=`` the row's budget and ``<= K``.
        accept: ``float64 [n, K]`` calibrated estimate that the first ``j + 1`` draft tokens of row ``i`` are all
            accepted (non-increasing along a row, in ``(0, 1]`` up to ``lengths[i]``, 0 after). ``accept[i].sum()`` is
            the expected number of accepted draft tokens (defined in the reference's ``arbitration.py`` and
            ``calibration.py``).
        source: ``int8 [n]`` index into :data:`~das_trl.drafter.sources.SOURCE_ORDER` of the winning source, or
            :data:`NO_SOURCE`.
        match_len: ``int32 [n]`` context tokens the winning draft matched (0 when no draft).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    accept: np.ndarray
    source: np.ndarray
    match_len: np.ndarray

    @classmethod
    def empty(cls, n: int, k: int) -> "DraftBatch":
        """All-zero batch of ``n`` rows and width ``k`` (no drafts)."""
        return cls(np.zeros((n, k), np.int32), np.zeros(n, np.int32), np.zeros((n, k), np.float64),
                   np.full(n, NO_SOURCE, np.int8), np.zeros(n, np.int32))

    def __len__(self) -> int:
        return len(self.lengths)

    def row(self, i: int) -> list[int]:
        """Row ``i``'s draft as a list of ints."""
        return self.tokens[i, : int(self.lengths[i])].tolist()

    def as_lists(self) -> list[list[int]]:
        """Every row's draft as ``list[list[int]]`` (vLLM's ``propose`` return type)."""
        return [self.tokens[i, :n].tolist() for i, n in enumerate(self.lengths.tolist())]

    def source_name(self, i: int) -> str | None:
        """Name of row ``i``'s winning source, or ``None``."""
        s = int(self.source[i])
        return SOURCE_ORDER[s] if s >= 0 else None

    def truncate_rows(self, rows: np.ndarray, budgets: np.ndarray) -> None:
        """Cut rows ``rows`` (``int [m]``, distinct) to at most ``budgets`` (``int [m]``, negative = 0) tokens in place,
        writing into the existing arrays (views of a reused buffer stay valid); other rows are untouched. Costs
        O(m K), not O(n K): the Speculator cuts only the rows that drafted.

        Raises:
            ValueError: ``rows`` and ``budgets`` differ in length, a row is out of range or not an integer, or a
                budget is not an integer (nothing changed).
        """
        rows = np.asarray(rows).reshape(-1)
        b = np.asarray(budgets).reshape(-1)
        if b.shape != rows.shape:
            raise ValueError(f"budgets must have shape {rows.shape} like rows, got {b.shape}")
        if len(rows) and (rows.dtype.kind not in "iu" or b.dtype.kind not in "iu"
                          or rows.min() < 0 or rows.max() >= len(self.lengths)):
            raise ValueError(f"rows must be integer indices in [0, {len(self.lengths)}) and budgets integers, got "
                             f"{rows.dtype} rows in [{rows.min()}, {rows.max()}] and {b.dtype} budgets")
        old = self.lengths[rows]
        new = np.minimum(old, np.maximum(b, 0)).astype(np.int32)
        cut = np.flatnonzero(new < old)
        if not len(cut):
            return
        r, keep = rows[cut], new[cut]
        dead = np.arange(self.tokens.shape[1])[None, :] >= keep[:, None]
        self.tokens[r] = np.where(dead, 0, self.tokens[r])
        self.accept[r] = np.where(dead, 0.0, self.accept[r])
        gone = r[keep == 0]
        self.source[gone] = NO_SOURCE
        self.match_len[gone] = 0
        self.lengths[r] = keep

    def truncate(self, budgets: np.ndarray) -> None:
        """Cut every row to at most ``budgets[i]`` tokens in place (``int [n]``, negative = 0)."""
        b = np.clip(np.asarray(budgets, dtype=np.int64), 0, None)
        if b.shape != self.lengths.shape:
            raise ValueError(f"budgets must have shape {self.lengths.shape}, got {b.shape}")
        new = np.minimum(self.lengths, b).astype(np.int32)
        cols = np.arange(self.tokens.shape[1])
        dead = cols[None, :] >= new[:, None]
        self.tokens[dead] = 0
        self.accept[dead] = 0.0
        self.source[new == 0] = NO_SOURCE
        self.match_len[new == 0] = 0
        self.lengths = new
