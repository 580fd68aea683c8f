"""The engine-step cost model ``t(T) = c_base + c_tok * T`` and its online fit from observed step times.

``T`` is the number of tokens in one forward pass (running requests + their draft tokens + prefill chunks), ``t``
the pass's time in milliseconds. The budget controller (``controller.py``) reads the two coefficients; they come
from configuration (the DAS paper's Fig. 8 measured 7 ms + 0.025 ms/token on its GPUs), from ``das-trl bench
cost-profile`` (torch-level forward passes on the current device), or from :class:`OnlineCostFit` (the engine's own
step timings, as the vLLM proposer sees them).

numpy and the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """``t(T) = c_base_ms + c_tok_ms * T`` (milliseconds per forward pass of ``T`` tokens).

    Raises:
        ValueError: a coefficient is not finite or not > 0 (a zero ``c_tok`` would make every draft free).
    """

    c_base_ms: float = 7.0
    c_tok_ms: float = 0.025

    def __post_init__(self) -> None:
        for name in ("c_base_ms", "c_tok_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"CostModel: {name} must be a finite number > 0 (ms), got {v!r}; measure it with "
                                 f"`das-trl bench cost-profile` or use the paper's 7.0 / 0.025")

    def step_ms(self, tokens: float | np.ndarray) -> float | np.ndarray:
        """Time of a pass of ``tokens`` tokens (ms)."""
        return self.c_base_ms + self.c_tok_ms * tokens


def fit_linear(tokens: np.ndarray, ms: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``ms ~ c_base + c_tok * tokens``.

    Args:
        tokens: ``float64 [m]`` tokens per pass.
        ms: ``float64 [m]`` pass times (ms).

    Returns:
        ``(c_base_ms, c_tok_ms, r2)``; ``(nan, nan, nan)`` with fewer than 2 points or no spread in ``tokens``.
    """
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(ms, dtype=np.float64)
    if x.size < 2 or float(np.ptp(x)) == 0.0:
        return math.nan, math.nan, math.nan
    xm, ym = float(x.mean()), float(y.mean())
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - ym)).sum()) / sxx
    base = ym - slope * xm
    resid = y - (base + slope * x)
    syy = float(((y - ym) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / syy if syy > 0 else 0.0
    return base, slope, r2


class OnlineCostFit:
    """Windowed least-squares fit of the cost model from ``(tokens in the pass, pass time)`` observations.

    The vLLM proposer feeds one observation per engine step in which it can account for every token (decode rows
    only: it knows each row's one sampled token and the draft tokens vLLM scheduled; it cannot see how a prompt is
    split into prefill chunks, so steps with prefills are skipped). The time it measures is the interval between the
    end of one ``propose`` call and the start of the next: the forward pass plus sampling, rejection sampling and
    scheduling, without the drafter's own time. It cannot see a pass's time directly, an engine idle between two
    ``generate`` calls (such gaps are dropped as outliers), or work in other processes that overlaps the step.

    Args:
        window: most recent observations kept (int >= 8).
        min_steps: observations needed before :meth:`estimate` answers (int >= 2).
        min_r2: smallest coefficient of determination accepted (float in [0, 1]); a fit explaining less of the
            variance (noise, a machine shared with other jobs) is not used.
        min_spread_tokens: smallest ``max - min`` of the observed token counts (a fit over one batch size cannot
            separate ``c_base`` from ``c_tok``).

    Not thread-safe (one proposer calls it).
    """

    def __init__(self, window: int = 256, min_steps: int = 64, min_r2: float = 0.3,
                 min_spread_tokens: int = 8) -> None:
        if window < 8 or min_steps < 2 or min_steps > window or not 0.0 <= min_r2 <= 1.0 or min_spread_tokens < 1:
            raise ValueError(f"OnlineCostFit: need window >= 8, 2 <= min_steps <= window, 0 <= min_r2 <= 1, "
                             f"min_spread_tokens >= 1; got {window}, {min_steps}, {min_r2}, {min_spread_tokens}")
        self.window, self.min_steps, self.min_r2, self.min_spread = window, min_steps, min_r2, min_spread_tokens
        self._tokens = np.zeros(window, np.float64)
        self._ms = np.zeros(window, np.float64)
        self._count = 0          # observations kept (<= window)
        self._next = 0           # ring-buffer write position
        self.observed = 0        # observations offered
        self.dropped = 0         # rejected as idle gaps / invalid
        self._cached: tuple[float, float, float] | None = None

    def add(self, tokens: int, ms: float) -> None:
        """Record one engine step: ``tokens`` in its forward pass, ``ms`` milliseconds.

        Steps longer than 20x the median of the kept ones (an idle engine between two generations), and
        non-positive or non-finite values, are dropped."""
        self.observed += 1
        if not (tokens > 0 and ms > 0 and math.isfinite(ms)):
            self.dropped += 1
            return
        if self._count >= 8 and ms > 20.0 * float(np.median(self._ms[: self._count])):
            self.dropped += 1
            return
        self._tokens[self._next] = tokens
        self._ms[self._next] = ms
        self._next = (self._next + 1) % self.window
        self._count = min(self._count + 1, self.window)
        self._cached = None

    def fit(self) -> tuple[float, float, float]:
        """``(c_base_ms, c_tok_ms, r2)`` over the kept observations (nan when not computable)."""
        if self._cached is None:
            self._cached = fit_linear(self._tokens[: self._count], self._ms[: self._count])
        return self._cached

    def estimate(self) -> CostModel | None:
        """The fitted :class:`CostModel`, or ``None`` while the fit is not trustworthy: too few observations, too
        little spread in token counts, ``r2 < min_r2``, or a coefficient <= 0."""
        if self._count < self.min_steps:
            return None
        if float(np.ptp(self._tokens[: self._count])) < self.min_spread:
            return None
        base, tok, r2 = self.fit()
        if not (base > 0 and tok > 0 and r2 >= self.min_r2):
            return None
        return CostModel(base, tok)

    def stats(self) -> dict:
        """``steps`` kept, ``observed``, ``dropped``, and the current fit (``c_base_ms``, ``c_tok_ms``, ``r2``;
        nan when not computable)."""
        base, tok, r2 = self.fit()
        return {"steps": self._count, "observed": self.observed, "dropped": self.dropped,
                "c_base_ms": base, "c_tok_ms": tok, "r2": r2}
