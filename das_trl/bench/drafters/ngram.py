"""The ``ngram`` baseline: vLLM's prompt lookup (``method="ngram"``), re-implemented for the replay."""

from __future__ import annotations

import numpy as np

from .base import Drafter


def prompt_lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM ``ngram`` proposal: longest n in [min_n, max_n] whose last-n-gram occurs earlier in ``tokens``; the k
    tokens after its earliest occurrence."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        if n <= 0:
            break
        pat = tokens[total - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)
        hits = np.nonzero((windows == pat).all(axis=1))[0]
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramDrafter(Drafter):
    """Longest suffix n-gram in ``[min_n, max_n]`` of prompt + output, earliest occurrence, ``k`` tokens after it.

    Its CPU time is measured but not representative (``cpu_representative``): vLLM's ``ngram`` is a numba kernel,
    this is numpy."""

    cpu_representative = False

    def __init__(self, min_n: int = 5, max_n: int = 5, k: int = 8) -> None:
        self.name = "ngram"
        self.min_n, self.max_n, self.k = min_n, max_n, k

    def budgets(self, running):
        return [self.k] * len(running)

    def propose(self, rid, context, budget):
        return prompt_lookup(context, self.min_n, self.max_n, budget)
