"""What each running request has left, sampled: remaining tokens and tokens per round (the Monte Carlo behind the
tail probability and the survival of draft positions; ``docs/budget.md``, "Who finishes last")."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

_NORMAL = NormalDist()
#: Pseudo-rounds at 1 token per round in a row's observed tokens-per-round estimate (the native kTauPseudoRounds).
TAU_PSEUDO_ROUNDS = 4.0


def remaining_samples(table: np.ndarray, counts: np.ndarray, pooled: np.ndarray, generated: np.ndarray,
                      max_remaining: np.ndarray | None, rng: np.random.Generator | np.ndarray, num_samples: int,
                      pooled_weight: float = 1.0, jitter: float = 0.1, extrapolation_fraction: float = 0.25,
                      min_remaining: float = 16.0) -> np.ndarray:
    """Sampled remaining lengths (tokens) per row, conditional on the tokens generated so far.

    Args:
        table: ``float64 [n, W]`` each row's problem lengths sorted ascending, :data:`~das_trl.drafter.
            length_table.PAD` before them (``LengthTable.gather``).
        counts: ``int [n]`` valid lengths per row (unused beyond validation: the padding is below any length).
        pooled: ``float64 [M]`` ascending pooled lengths of all problems (may be empty).
        generated: ``int/float [n]`` tokens generated so far.
        max_remaining: ``[n]`` most tokens each request may still generate (``inf`` or ``None``: no cap).
        rng: the generator (explicit state), or the draws themselves: ``float64 [4, n, S]`` uniforms in ``[0, 1)``
            (index, mixture, tail, jitter), e.g. :func:`stratified_draws`.
        num_samples: samples per row (S).
        pooled_weight, jitter, extrapolation_fraction, min_remaining: see
            :class:`~das_trl.budget.config.ControllerConfig`.

    Returns:
        ``float64 [n, S]``, every value in ``[1, max_remaining]``.
    """
    n, w = table.shape
    g = np.asarray(generated, dtype=np.float64).reshape(n, 1)
    s = int(num_samples)
    # One generator call (or the given draws): index, mixture, tail and jitter draws.
    u, v, e, j = rng if isinstance(rng, np.ndarray) else rng.random((4, n, s))
    # The problem's own lengths above g are its last `above` columns (sorted ascending, padding first).
    above = (table > g).sum(axis=1, keepdims=True)
    own = np.take_along_axis(table, np.clip(w - above + (u * above).astype(np.int64), 0, w - 1), axis=1)
    m = len(pooled)
    if m:
        above_pool = (pooled[None, :] > g).sum(axis=1, keepdims=True)
        pool = pooled[np.clip(m - above_pool + (u * above_pool).astype(np.int64), 0, m - 1)]
    else:
        above_pool = np.zeros((n, 1), np.int64)
        pool = np.zeros((n, s))
    scale = np.maximum(float(min_remaining), extrapolation_fraction * g)
    extra = g - scale * np.log1p(-e)  # exponential tail past every observed length
    # Mixture: own lengths with weight `above`, pooled ones with `pooled_weight` pseudo-samples.
    p_pool = np.where(above_pool > 0, pooled_weight / np.maximum(above + pooled_weight, 1e-12), 0.0)
    use_pool = (v < p_pool) | ((above == 0) & (above_pool > 0))
    total = np.where(use_pool, pool, np.where(above > 0, own, extra))
    total = np.where(total > g, total, extra)  # a pooled draw can only be chosen above g; guard anyway
    rem = total - g
    if jitter > 0:  # log-uniform with standard deviation `jitter` in log space
        rem *= np.exp(jitter * math.sqrt(3.0) * (2.0 * j - 1.0))
    rem = np.maximum(rem, 1.0)
    if max_remaining is not None:
        cap = np.maximum(np.asarray(max_remaining, dtype=np.float64).reshape(n, 1), 1.0)
        rem = np.minimum(rem, cap)
    return rem


def stratified_draws(n: int, num_samples: int) -> np.ndarray:
    """Deterministic draws for :func:`remaining_samples`: ``float64 [4, n, S]``, the same ``S`` stratified points
    ``(t + 1/2) / S`` for every row, in four different orders (index, mixture, tail, jitter) so the four are not
    correlated. No generator state: the same inputs give the same budgets in every run (reproducible rollouts), and
    rows with the same inputs get the same samples (they tie exactly in the tail probability)."""
    s = int(num_samples)
    base = (np.arange(s, dtype=np.float64) + 0.5) / s
    orders = [np.arange(s), (np.arange(s) * 5 + 1) % s, (np.arange(s) * 11 + 3) % s, (np.arange(s) * 13 + 7) % s]
    if s > 1 and math.gcd(5, s) * math.gcd(11, s) * math.gcd(13, s) != 1:  # keep them permutations
        orders = [np.arange(s), np.arange(s)[::-1], np.roll(np.arange(s), s // 2), np.roll(np.arange(s)[::-1], s // 3)]
    rows = np.stack([base[o] for o in orders])  # [4, S]
    return np.ascontiguousarray(np.broadcast_to(rows[:, None, :], (4, n, s)))


def tau_quantiles(num_samples: int) -> np.ndarray:
    """``float64 [S]`` standard normal quantiles at ``(t + 1/2) / S``, in an order (``7 t + 2 mod S``) unrelated to
    the four of :func:`stratified_draws`, so a sample's tokens per round is not tied to its remaining length."""
    s = int(num_samples)
    order = (np.arange(s) * 7 + 2) % s if math.gcd(7, s) == 1 else np.arange(s)[::-1]
    z = np.array([_NORMAL.inv_cdf((t + 0.5) / s) for t in order])
    z.flags.writeable = False
    return z


def tau_samples(tau_obs: np.ndarray, rounds: np.ndarray, rem_mean: np.ndarray, z: np.ndarray,
                uncertainty: float = 1.0) -> np.ndarray:
    """Sampled tokens per round of each row for its remaining rounds: ``float64 [n, S]``, each ``>= 1``.

    A row's tokens per round so far (``tau_obs``) is a mean of a few noisy rounds, and its remaining rounds will
    average out to something else again: a row drafting at modest acceptance may finish well before or after its
    expected round. Its samples are ``tau_obs * exp(sd / tau_obs * z)``, log-normal with standard deviation
    ``sd = uncertainty * sqrt(max(tau_obs - 1, 0) + 1/4) * sqrt(1 / (rounds + 4) + 1 / max(rem_mean / tau_obs, 1))``:
    the per-round spread of the tokens a round emits (about ``tau - 1`` for geometric acceptance; a quarter of a
    token at least), over the rounds seen (with the estimate's 4 pseudo-rounds) and the rounds still to come. Without
    it every row keeps its observed speed exactly, and a crowd of requests cut at the same ``max_tokens`` lands in the
    same bin of :func:`~das_trl.budget.tail.tail_probability`'s histogram and shares the tail probability equally,
    whatever their speeds; with it, the rows that are slower (or whose speed is less certain) get more of it
    (replays: benchmarks/NOTES.md, "Adopted: uncertain speeds, and the CPU of drafts the cut drops";
    ``ControllerConfig.tau_uncertainty``).

    Args:
        tau_obs: ``float64 [n]`` observed tokens per round (``>= 1``).
        rounds: ``[n]`` verification rounds so far.
        rem_mean: ``float64 [n]`` mean sampled remaining tokens.
        z: ``float64 [S]`` standard normal quantiles (:func:`tau_quantiles`).
        uncertainty: the factor on ``sd`` (0: exactly ``tau_obs``).
    """
    tau_obs = np.asarray(tau_obs, dtype=np.float64)
    seen = np.maximum(np.asarray(rounds, dtype=np.float64), 0.0) + TAU_PSEUDO_ROUNDS
    ahead = np.maximum(rem_mean / tau_obs, 1.0)
    sd = uncertainty * np.sqrt(np.maximum(tau_obs - 1.0, 0.0) + 0.25) * np.sqrt(1.0 / seen + 1.0 / ahead)
    return np.maximum(tau_obs[:, None] * np.exp((sd / tau_obs)[:, None] * z[None, :]), 1.0)
