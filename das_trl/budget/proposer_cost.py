"""The proposer's own CPU per drafted row, measured: an opt-in price for the gate (``draft_row_source="measured"``).

vLLM runs the proposer on the engine's critical path, so the gate charges each drafted row the proposer's CPU for it
(``ControllerConfig.draft_row_us``). That price is configured by default, so that two runs of the same rollouts make
the same drafts; :class:`ProposerCostFit` measures it instead from the proposer's own step times, for a user who
prefers the price of this host to reproducibility (``docs/budget.md``, "Counting the proposer's CPU").

numpy and the standard library only.
"""

from __future__ import annotations

import math

import numpy as np


class ProposerCostFit:
    """Windowed least-squares fit ``us ~ a + b * rows + c * drafted`` of the proposer's CPU per engine step
    (microseconds of the calling thread), from which :meth:`estimate_us` gives ``c``: the CPU one more drafted row
    costs. ``rows`` separates the per-row work every step pays (the hand-over of new tokens) from the drafting.

    Args:
        window: most recent steps kept (int >= 16).
        min_steps: steps with at least one drafted row needed before :meth:`estimate_us` answers (int >= 4).
        refit_every: steps between two fits (the fit costs tens of microseconds; it is not redone every step).

    Raises:
        ValueError: arguments out of range.

    Not thread-safe (one proposer calls it).
    """

    def __init__(self, window: int = 512, min_steps: int = 32, refit_every: int = 32) -> None:
        if window < 16 or not 4 <= min_steps <= window or refit_every < 1:
            raise ValueError(f"ProposerCostFit: need window >= 16, 4 <= min_steps <= window, refit_every >= 1; got "
                             f"{window}, {min_steps}, {refit_every}")
        self.window, self.min_steps, self.refit_every = window, min_steps, refit_every
        self._x = np.zeros((window, 3), np.float64)  # 1, rows, drafted rows
        self._x[:, 0] = 1.0
        self._us = np.zeros(window, np.float64)
        self._count = self._next = self._since_fit = 0
        self._fit: tuple[float, float, float] = (math.nan, math.nan, math.nan)

    def add(self, rows: int, drafted: int, seconds: float) -> None:
        """One engine step of the proposer: ``rows`` in the batch, ``drafted`` of them drafted, ``seconds`` of its
        CPU. Non-finite or negative times are ignored."""
        if not (math.isfinite(seconds) and seconds >= 0.0 and rows >= 0 and drafted >= 0):
            return
        self._x[self._next, 1] = rows
        self._x[self._next, 2] = drafted
        self._us[self._next] = 1e6 * seconds
        self._next = (self._next + 1) % self.window
        self._count = min(self._count + 1, self.window)
        self._since_fit += 1

    def fit(self) -> tuple[float, float, float]:
        """``(a, b, c)`` in microseconds (per step, per row, per drafted row); nan until computable (fewer than
        ``min_steps`` steps that drafted, or no spread in the drafted rows)."""
        if self._since_fit >= self.refit_every or math.isnan(self._fit[0]):
            self._since_fit = 0
            x, y = self._x[: self._count], self._us[: self._count]
            drafted = x[:, 2]
            if int(np.count_nonzero(drafted)) < self.min_steps or float(np.ptp(drafted)) == 0.0:
                self._fit = (math.nan, math.nan, math.nan)
            else:
                cols = x if float(np.ptp(x[:, 1])) > 0 else x[:, [0, 2]]  # one batch size: no per-row term
                coef = np.linalg.lstsq(cols, y, rcond=None)[0]
                self._fit = (float(coef[0]), float(coef[1]), float(coef[2])) if cols.shape[1] == 3 else \
                    (float(coef[0]), 0.0, float(coef[1]))
        return self._fit

    def estimate_us(self) -> float | None:
        """The measured CPU of one drafted row (microseconds, >= 0), or ``None`` while it is not computable."""
        c = self.fit()[2]
        return max(c, 0.0) if math.isfinite(c) else None

    def stats(self) -> dict:
        """``steps`` kept and the fit (``a_us``, ``b_us``, ``c_us``; nan until computable)."""
        a, b, c = self.fit()
        return {"steps": self._count, "a_us": a, "b_us": b, "c_us": c}
