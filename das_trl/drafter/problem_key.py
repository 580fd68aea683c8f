"""Stable identity of a GRPO problem, derived from its prompt token ids.

All siblings of a GRPO group share the prompt, and a problem's prompt is the same
every epoch, so a hash of the prompt token ids is a key that any client can compute
(DESIGN.md, "Problem identity"). Python's ``hash`` is salted per process, so the key
is a blake2b digest instead.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

_INT32_MAX = 2**31 - 1
_KEY_MASK = (1 << 63) - 1


def problem_key(prompt_token_ids: Sequence[int] | np.ndarray) -> int:
    """Return a stable 63-bit non-negative key for a prompt.

    Args:
        prompt_token_ids: 1-D token ids (list, tuple or numpy array of any integer
            dtype); each id must lie in ``[0, 2**31)``. May be empty.

    Returns:
        ``int`` in ``[0, 2**63)``: the first 8 bytes (little-endian) of
        ``blake2b(ids as int32 little-endian bytes, digest_size=8)``, top bit cleared.
        Identical across dtypes, container types and processes.

    Raises:
        ValueError: ids are not integers, not 1-D, or outside ``[0, 2**31)``.
    """
    arr = np.asarray(prompt_token_ids)
    if arr.size == 0:
        arr = np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"prompt_token_ids must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"prompt_token_ids must be integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX):
        raise ValueError("prompt_token_ids must lie in [0, 2**31)")
    data = arr.astype("<i4", copy=False).tobytes()
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "little") & _KEY_MASK
