"""The engine-step cost model ``t = c_base + c_tok * T + c_logprob * R`` and its online fit from observed step times.

``T`` is the number of tokens in one forward pass (running requests + their draft tokens + prefill chunks), ``t``
the pass's time in milliseconds. ``R`` is the rows of the verification logprob path (TRL always asks the engine for
the sampled tokens' logprobs): the verified positions where das-trl's patch is installed (``"patched"``,
``das_trl.vllm.verification_logprobs``), ``rows x (longest draft + 1)`` on vLLM's own padded path (``"padded"``); a
step without drafts has one per row either way. The budget controller (``controller.py``) reads the coefficients; they
come from configuration (the DAS paper's Fig. 8 measured 7 ms + 0.025 ms/token on its GPUs; ``c_logprob``:
:data:`ASSUMED_C_LOGPROB_MS`, what ``recipes/gpu/verification_cost.py`` measured on an H200), from ``das-trl bench
cost-profile`` (torch-level forward passes on the current device), or from :class:`OnlineCostFit` (the engine's own
step timings, as the vLLM proposer sees them).

numpy and the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: The shapes of the verification logprob path (:func:`logprob_rows`).
VERIFICATION_SHAPES = ("patched", "padded")

#: The vocabulary :data:`ASSUMED_C_LOGPROB_MS` is stated for (Qwen2 / Qwen2.5's 151,936 entries).
ASSUMED_LOGPROB_VOCAB = 151_936

#: ms per row of the verification logprob path at :data:`ASSUMED_LOGPROB_VOCAB` on an H100/H200-class GPU, measured:
#: ``recipes/gpu/verification_cost.py --compile`` on an H200 (torch 2.11, bf16 logits, B 64-1024, longest draft
#: 1-64; the rank count compiled, as vLLM's ``batched_count_greater_than`` is) fitted 0.93 ms + 0.98 us per row (r2
#: 0.976); with the rank count eager, 1.91 us (r2 0.998). Results: ``benchmarks/results/h200/``. The value, 1 us, was
#: first an estimate from memory bandwidth, ~1.1 us: vLLM's padded path moves ~7 float32 vocabulary rows per row
#: (0.61 MB each): the gather into the padded layout (read + write), the log-softmax (three reads, one write: a 0.61 MB
#: row does not fit in shared memory) and the rank count (one read): ~4.3 MB at 3.8 TB/s (80 % of the H200's
#: 4.8 TB/s); the patched path's ~5 (no gather) plus building the float32 logits (~3), per verified position, come
#: to about the same. It scales with the vocabulary and inversely with memory bandwidth (docs/gpu.md, "What
#: verification logprobs cost").
ASSUMED_C_LOGPROB_MS = 0.001


def assumed_c_logprob_ms(vocab_size: int | None = None) -> float:
    """:data:`ASSUMED_C_LOGPROB_MS` scaled to a vocabulary of ``vocab_size`` entries (the path's work is in
    proportion to it); ``None``: the figure as stated, at :data:`ASSUMED_LOGPROB_VOCAB`.

    Raises:
        ValueError: ``vocab_size`` below 1.
    """
    if vocab_size is None:
        return ASSUMED_C_LOGPROB_MS
    if int(vocab_size) < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return ASSUMED_C_LOGPROB_MS * int(vocab_size) / ASSUMED_LOGPROB_VOCAB


def logprob_rows(shape: str, rows, verified, longest):
    """Rows of one step's verification logprob path.

    Args:
        shape: ``"patched"`` (each row's own draft + 1) or ``"padded"`` (vLLM's ``rows x (longest + 1)``).
        rows: requests in the step (number or array).
        verified: verified positions, ``rows + draft tokens`` (number or array).
        longest: the step's longest draft (tokens; number or array).

    Returns:
        ``verified`` (patched) or ``rows * (longest + 1)`` (padded), elementwise for arrays.

    Raises:
        ValueError: an unknown ``shape``.
    """
    if shape == "patched":
        return verified
    if shape == "padded":
        return rows * (longest + 1)
    raise ValueError(f"verification shape must be one of {VERIFICATION_SHAPES}, got {shape!r}")


@dataclass(frozen=True)
class CostModel:
    """``t = c_base_ms + c_tok_ms * T + c_logprob_ms * R`` (milliseconds per engine step of ``T`` tokens and ``R``
    logprob rows, :func:`logprob_rows` under ``verification_shape``).

    Raises:
        ValueError: ``c_base_ms`` / ``c_tok_ms`` not finite or not > 0 (a zero ``c_tok`` would make every draft free),
            ``c_logprob_ms`` not finite or < 0, or an unknown ``verification_shape``.
    """

    c_base_ms: float = 7.0
    c_tok_ms: float = 0.025
    c_logprob_ms: float = 0.0
    verification_shape: str = "patched"

    def __post_init__(self) -> None:
        for name in ("c_base_ms", "c_tok_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"CostModel: {name} must be a finite number > 0 (ms), got {v!r}; measure it with "
                                 f"`das-trl bench cost-profile` or use the paper's 7.0 / 0.025")
        v = self.c_logprob_ms
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise ValueError(f"CostModel: c_logprob_ms must be a finite number >= 0 (ms per logprob row), got {v!r}; "
                             f"measure it with recipes/gpu/verification_cost.py or use {ASSUMED_C_LOGPROB_MS}")
        if self.verification_shape not in VERIFICATION_SHAPES:
            raise ValueError(f"CostModel: verification_shape must be one of {VERIFICATION_SHAPES}, got "
                             f"{self.verification_shape!r} (das_trl.vllm.verification_logprobs.verification_shape())")

    @property
    def token_ms(self) -> float:
        """What one more verified token costs where it does not lengthen the step's longest draft: its forward
        share and its own logprob row (``c_tok + c_logprob``)."""
        return self.c_tok_ms + self.c_logprob_ms

    @property
    def padded(self) -> bool:
        """Whether the logprob path is padded to ``rows x (longest + 1)``."""
        return self.verification_shape == "padded"

    def step_ms(self, tokens, rows=None, longest=0):
        """Time of a decode step of ``tokens`` tokens, each a verified position (ms). ``rows`` / ``longest``: the
        step's requests and longest draft, for the logprob term (``None`` rows: the forward pass alone). Numbers or
        arrays."""
        if rows is None or not self.c_logprob_ms:
            return self.c_base_ms + self.c_tok_ms * tokens
        return (self.c_base_ms + self.c_tok_ms * tokens
                + self.c_logprob_ms * logprob_rows(self.verification_shape, rows, tokens, longest))


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
