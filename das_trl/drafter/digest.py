"""Content digest of a rollout history: equal digests mean two engines draft from the same history.

The digest covers what drafting depends on, in push order: each live appearance's problem key, its completions
(lengths and token ids) and its prompt tail. It leaves out bookkeeping that may legitimately differ between engines
holding the same history (appearance ids, eviction counters, window and budget settings).
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import numpy as np

from .history import RolloutHistory

# Arrays of RolloutHistory.to_state() that the digest covers, in this order.
_DIGEST_KEYS = ("problem_keys", "num_seqs", "seq_lens", "tokens", "tail_lens", "tails")
_DIGEST_DTYPES = {"problem_keys": "<u8", "num_seqs": "<i8", "seq_lens": "<i8", "tokens": "<i4",
                  "tail_lens": "<i8", "tails": "<i4"}


def state_digest(state: Mapping[str, object]) -> str:
    """Digest of a history state dict (the output of :meth:`RolloutHistory.to_state`, or those arrays after a
    ``np.load``).

    Args:
        state: mapping with the arrays ``problem_keys`` (uint64), ``num_seqs``, ``seq_lens``, ``tail_lens`` (int64),
            ``tokens``, ``tails`` (int32); other keys are ignored.

    Returns:
        32 hex characters (blake2b-128). Cost: one pass over the token arrays (about 0.1 s per 10M tokens).

    Raises:
        KeyError: a required array is missing.
    """
    h = hashlib.blake2b(digest_size=16)
    for key in _DIGEST_KEYS:
        arr = np.ascontiguousarray(np.asarray(state[key]).astype(_DIGEST_DTYPES[key], copy=False))
        h.update(key.encode())
        h.update(np.int64(arr.size).tobytes())
        h.update(arr.tobytes())
    return h.hexdigest()


def history_digest(history: RolloutHistory) -> str:
    """Digest of a :class:`RolloutHistory` (see :func:`state_digest`); an empty history always gives the same
    value."""
    return state_digest(history.to_state())
