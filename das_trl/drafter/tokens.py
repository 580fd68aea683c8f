"""Token-id validation and the grouping of one history push by problem, shared by both drafter implementations.

Every id that enters a drafter passes :func:`as_tokens` once per call (the whole array, not per token);
:func:`group_rollouts` is the common front half of ``add_rollouts``: it validates a whole push before either
implementation changes its state.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .problem_key import problem_key

#: Token ids must lie in ``[0, TOKEN_LIMIT)`` (they are stored as int32).
TOKEN_LIMIT = 2**31
_INT32 = np.dtype(np.int32)


def int32_array(a: np.ndarray | Sequence[int], name: str, n: int | None = None) -> np.ndarray:
    """``a`` as a C-contiguous ``int32 [n]`` array, without a copy when it is one already (vLLM's per-row arrays
    are: the engine step's hot path then converts nothing).

    Raises:
        ValueError: ``a`` does not have ``n`` entries (when ``n`` is given), holds values outside int32, or (a float
            or other non-integer array) values that are not whole numbers (NaN, inf, 9.7).
    """
    if type(a) is np.ndarray and a.dtype is _INT32 and a.ndim == 1 and a.flags.c_contiguous:
        # The hot path (vLLM's arrays, the Speculator's; several calls per engine step): attribute checks only, no
        # numpy call. ``is`` against the canonical dtype costs a third of ``==``; an equal non-canonical dtype (rare)
        # takes the general path, which returns the array unchanged as well.
        arr = a
    else:
        arr = np.asarray(a).reshape(-1)
        if arr.dtype != np.int32:
            whole = arr.dtype.kind in "iub" or not arr.size or (np.isfinite(arr).all() and (arr == np.round(arr)).all())
            if not whole:
                raise ValueError(f"step: {name} must hold integers, got {arr[~(arr == np.round(arr))][:3].tolist()}")
            if arr.size and (arr.min() < -TOKEN_LIMIT or arr.max() >= TOKEN_LIMIT):
                raise ValueError(f"step: {name} must fit in int32, got values in [{arr.min()}, {arr.max()}]")
            arr = arr.astype(np.int32)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
    if n is not None and len(arr) != n:
        raise ValueError(f"step: {name} must have one entry per row ({n}), got {len(arr)}")
    return arr


def check_request_id(request_id: object) -> None:
    """Raise ``ValueError`` unless ``request_id`` is a ``str`` or an ``int`` (vLLM's ids are strings; a ``None`` or a
    list would otherwise become a live request no engine call can name)."""
    if not isinstance(request_id, (str, int, np.integer)) or isinstance(request_id, (bool, np.bool_)):
        raise ValueError(f"request_id must be a str or an int, got {type(request_id).__name__} {request_id!r}")


def count_array(values: Sequence[int] | np.ndarray, what: str, *, low: int) -> np.ndarray:
    """Per-row token counts (draft budgets, lengths sent) as a 1-D ``np.int64`` array, values outside int32 clipped
    into it (no draft is that long).

    Raises:
        ValueError: not whole numbers (strings, 2.7, NaN, bools), or a value below ``low``.
    """
    arr = np.asarray(values).reshape(-1)
    if arr.dtype == object and all(type(v) is int for v in arr.tolist()):  # Python ints past 64 bits
        arr = np.asarray([min(max(v, -TOKEN_LIMIT), TOKEN_LIMIT - 1) for v in arr.tolist()], dtype=np.int64)
    if arr.size and arr.dtype.kind not in "iu":
        whole = arr.dtype.kind == "f" and bool(np.isfinite(arr).all() and (arr == np.round(arr)).all())
        if not whole:
            raise ValueError(f"{what} must hold ints, got {arr[:3].tolist()} ({arr.dtype})")
    if arr.dtype.kind == "u":
        arr = np.minimum(arr.astype(np.uint64), TOKEN_LIMIT - 1)  # uint64 past int64 would wrap in the cast below
    arr = np.clip(arr.astype(np.float64) if arr.dtype.kind == "f" else arr.astype(np.int64), -TOKEN_LIMIT,
                  TOKEN_LIMIT - 1).astype(np.int64)
    if arr.size and int(arr.min()) < low:
        raise ValueError(f"{what} must be >= {low}, got {int(arr.min())}")
    return arr


def as_tokens(ids: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    """Validate token ids and return a fresh writeable 1-D ``np.int32`` array.

    Raises:
        ValueError: not 1-D, not integers (bools and floats rejected), or outside
            ``[0, 2**31)``.
    """
    if isinstance(ids, np.ndarray):
        arr = ids
    else:
        try:
            seq = ids if isinstance(ids, list) else list(ids)
        except TypeError:
            raise ValueError(f"{what} must be a sequence of ints, got {type(ids).__name__}") from None
        if not seq:
            return np.zeros(0, np.int32)
        # Check the distinct element types, not every element (per-token isinstance checks cost ~0.25 us/token on pushes).
        if not all(issubclass(t, (int, np.integer)) and not issubclass(t, (bool, np.bool_))
                   for t in set(map(type, seq))):
            raise ValueError(f"{what} must contain only ints")
        try:
            arr = np.asarray(seq)
        except OverflowError:
            raise ValueError(f"{what} token ids must lie in [0, 2**31)") from None
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, np.int32)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must have an integer dtype, got {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= TOKEN_LIMIT:
        raise ValueError(f"{what} token ids must lie in [0, 2**31), got range [{lo}, {hi}]")
    return np.array(arr, dtype=np.int32)


def token_view(ids: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    """:func:`as_tokens` without its copy where ``ids`` is already a 1-D ``np.int32`` array: that array itself,
    checked (every ``int32`` is below ``2**31``, so only the lower bound is read). For a call that copies the ids
    before it returns (the native core's ``start``); keep nothing of the result past the call. Raises as
    :func:`as_tokens`."""
    if type(ids) is np.ndarray and ids.dtype == _INT32 and ids.ndim == 1:
        if ids.size and int(np.minimum.reduce(ids)) < 0:
            raise ValueError(f"{what} token ids must lie in [0, 2**31), got range [{int(ids.min())}, "
                             f"{int(ids.max())}]")
        return ids
    return as_tokens(ids, what)


def group_rollouts(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   problem_keys: Sequence[int] | None = None) -> tuple[dict[int, tuple[np.ndarray, list[np.ndarray]]],
                                                                      dict]:
    """Validate one push's rollouts and group them by problem (the shared front half of ``add_rollouts``).

    Returns:
        ``({problem_key: (prompt int32 array, [non-empty completion int32 arrays])}, summary)`` with summary
        ``{"problems", "sequences", "tokens"}`` (problems with at least one non-empty completion, completions,
        completion tokens).

    Raises:
        ValueError: mismatched lengths, ids not ints in ``[0, 2**31)``, or keys not ints in ``[0, 2**63)``. Nothing
            is changed then (the caller has not touched its state yet).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions")
    if problem_keys is not None and len(problem_keys) != len(prompts):
        raise ValueError(f"got {len(problem_keys)} problem_keys for {len(prompts)} rollouts")
    groups: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
    for i, (prompt, comp) in enumerate(zip(prompts, completions)):
        p = as_tokens(prompt, f"prompts[{i}]")
        c = as_tokens(comp, f"completions[{i}]")
        if problem_keys is not None:
            k = problem_keys[i]
            if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 0 <= int(k) < 2**63:
                raise ValueError(f"problem_keys[{i}] must be an int in [0, 2**63), got {k!r}")
            key = int(k)
        else:
            key = problem_key(p)
        entry = groups.setdefault(key, (p, []))
        if len(c):
            entry[1].append(c)
    summary = {"problems": sum(1 for _, comps in groups.values() if comps),
               "sequences": sum(len(comps) for _, comps in groups.values()),
               "tokens": sum(len(c) for _, comps in groups.values() for c in comps)}
    return groups, summary
