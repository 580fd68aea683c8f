"""Wire format for pushing one step's rollouts into an engine's drafter history.

vLLM's dev-mode ``POST /collective_rpc`` passes only strings, and ``collective_rpc`` in-process is happiest with plain
types, so a batch of rollouts travels as one ASCII string::

    base64( b"DAS1" | uint32 header_len | header JSON (utf-8) | int32 little-endian tokens )

The header holds ``{"prompt_lens": [...], "completion_lens": [...], "problem_keys": [...] | null}``; the token block is
all prompts then all completions, concatenated. Nothing in a payload is executed or unpickled: decoding is
``base64`` + ``json`` + ``numpy.frombuffer`` with every length checked before use.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAGIC = b"DAS1"
# 256 MiB of encoded text is ~48M tokens: far above one GRPO step, well below what would hurt the engine process.
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024 * 1024


class PayloadError(ValueError):
    """A history payload is malformed, truncated, oversized or holds invalid token ids."""


@dataclass
class Rollouts:
    """One step's rollouts, decoded.

    Attributes:
        prompts: ``list`` of 1-D ``np.int32`` arrays, one per rollout (GRPO siblings repeat their prompt).
        completions: ``list`` of 1-D ``np.int32`` arrays, ``completions[i]`` answers ``prompts[i]``.
        problem_keys: optional explicit problem ids (``int`` >= 0), one per rollout; ``None`` means "hash the prompt".
    """

    prompts: list[np.ndarray]
    completions: list[np.ndarray]
    problem_keys: list[int] | None = None

    def __len__(self) -> int:
        return len(self.completions)

    @property
    def num_tokens(self) -> int:
        """Completion tokens in the batch (what the history stores)."""
        return int(sum(len(c) for c in self.completions))


def encode_rollouts(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    problem_keys: Sequence[int] | None = None,
) -> str:
    """Encode rollouts for ``das_add_history``.

    Args:
        prompts: token ids per rollout (``int`` in ``[0, 2**31)``).
        completions: token ids per rollout, same length as ``prompts``.
        problem_keys: optional explicit problem id per rollout.

    Returns:
        ASCII ``str`` (base64), about 5.4 bytes per token.

    Raises:
        PayloadError: mismatched lengths or ids that do not fit int32.
    """
    if len(prompts) != len(completions):
        raise PayloadError(f"{len(prompts)} prompts but {len(completions)} completions: they must pair up")
    if problem_keys is not None and len(problem_keys) != len(completions):
        raise PayloadError(f"{len(problem_keys)} problem keys for {len(completions)} rollouts")
    arrays = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
    arrays += [np.asarray(c, dtype=np.int64).reshape(-1) for c in completions]
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**31):
        raise PayloadError("token ids must be integers in [0, 2**31)")
    header = {
        "prompt_lens": [int(len(a)) for a in arrays[: len(prompts)]],
        "completion_lens": [int(len(a)) for a in arrays[len(prompts) :]],
        "problem_keys": None if problem_keys is None else [int(k) for k in problem_keys],
    }
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    blob = MAGIC + struct.pack("<I", len(header_bytes)) + header_bytes + tokens.astype("<i4").tobytes()
    return base64.b64encode(blob).decode("ascii")


def _unbase64(payload: str | bytes, max_payload_bytes: int) -> bytes:
    """Size-check then base64-decode a payload. Raises PayloadError (not a string, oversized, not base64)."""
    if not isinstance(payload, (str, bytes)):
        raise PayloadError(f"payload must be a base64 string, got {type(payload).__name__}")
    if len(payload) > max_payload_bytes:
        raise PayloadError(f"payload of {len(payload)} bytes exceeds the limit of {max_payload_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PayloadError(f"payload is not valid base64: {exc}") from None


def decode_rollouts(
    payload: str | bytes,
    vocab_size: int | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Rollouts:
    """Decode and validate a payload made by :func:`encode_rollouts`.

    Args:
        payload: the base64 text (``str`` or ASCII ``bytes``).
        vocab_size: when given, every token id must be ``< vocab_size``.
        max_payload_bytes: payloads longer than this are rejected before decoding.

    Returns:
        :class:`Rollouts` with writeable ``np.int32`` arrays (arctic's ``*_ndarray`` methods reject read-only ones).

    Raises:
        PayloadError: with a message naming what is wrong; nothing is partially applied by the caller.
    """
    blob = _unbase64(payload, max_payload_bytes)
    if len(blob) < 8 or blob[:4] != MAGIC:
        raise PayloadError("payload does not start with the DAS1 magic: not a das-trl history payload")
    (header_len,) = struct.unpack("<I", blob[4:8])
    if 8 + header_len > len(blob):
        raise PayloadError("payload is truncated inside its header")
    try:
        header = json.loads(blob[8 : 8 + header_len].decode())
        prompt_lens = [int(n) for n in header["prompt_lens"]]
        completion_lens = [int(n) for n in header["completion_lens"]]
        problem_keys = header.get("problem_keys")
        if problem_keys is not None:
            problem_keys = [int(k) for k in problem_keys]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PayloadError(f"payload header is malformed: {exc}") from None
    if len(prompt_lens) != len(completion_lens):
        raise PayloadError(f"header has {len(prompt_lens)} prompts but {len(completion_lens)} completions")
    if problem_keys is not None and len(problem_keys) != len(completion_lens):
        raise PayloadError(f"header has {len(problem_keys)} problem keys for {len(completion_lens)} rollouts")
    if any(n < 0 for n in prompt_lens + completion_lens):
        raise PayloadError("header has negative sequence lengths")
    if problem_keys is not None and any(k < 0 for k in problem_keys):
        raise PayloadError("problem keys must be non-negative integers")
    body = blob[8 + header_len :]
    expected = 4 * (sum(prompt_lens) + sum(completion_lens))
    if len(body) != expected:
        raise PayloadError(f"payload token block has {len(body)} bytes, header announces {expected}: truncated?")
    tokens = np.frombuffer(body, dtype="<i4").astype(np.int32)  # astype copies: writeable, native order
    if tokens.size and tokens.min() < 0:
        raise PayloadError("payload holds negative token ids")
    if vocab_size is not None and tokens.size and tokens.max() >= vocab_size:
        raise PayloadError(f"payload holds token id {int(tokens.max())} outside the vocabulary (size {vocab_size})")
    bounds = np.cumsum([0] + prompt_lens + completion_lens)
    seqs = [tokens[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
    n = len(prompt_lens)
    return Rollouts(prompts=seqs[:n], completions=seqs[n:], problem_keys=problem_keys)


# ---------------------------------------------------------------------------------------------------------------------
# Whole-history payloads (``das_load_history``) and checkpoint files: RolloutHistory.to_state() as an .npz archive.

HISTORY_MAGIC = b"DASH"
_STATE_INTS = ("version", "window", "token_budget", "next_id", "evicted_appearances")
_STATE_ARRAYS = ("appearance_ids", "problem_keys", "num_seqs", "seq_lens", "tokens", "tail_lens", "tails")


def history_state_to_bytes(state: dict) -> bytes:
    """Serialize a :meth:`~das_trl.drafter.RolloutHistory.to_state` dict as an uncompressed ``.npz`` archive.

    Args:
        state: the dict (ints and integer numpy arrays).

    Returns:
        ``bytes`` (about 4 bytes per history token plus per-sequence lengths); readable with
        ``np.load(..., allow_pickle=False)``.

    Raises:
        PayloadError: a key is missing or an array is not an integer array (object arrays would need pickle).
    """
    import io

    arrays = {}
    for key in _STATE_INTS + _STATE_ARRAYS:
        if key not in state:
            raise PayloadError(f"history state lacks {key!r}")
        arr = np.asarray(state[key])
        if arr.dtype.kind not in "iu":
            raise PayloadError(f"history state {key!r} has dtype {arr.dtype}, expected integers")
        arrays[key] = arr
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def history_state_from_bytes(data: bytes, vocab_size: int | None = None,
                             max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> dict:
    """Parse :func:`history_state_to_bytes` output without unpickling anything.

    Args:
        data: the archive bytes.
        vocab_size: when given, every token id (completions and prompt tails) must be ``< vocab_size``.
        max_bytes: limit on the archive and on its declared uncompressed size (guards against zip bombs).

    Returns:
        ``dict`` with the ints of the state as Python ints and its arrays as numpy arrays, ready for
        ``RolloutHistory.from_state`` / ``DASDrafter.load_state_dict`` (which check the arrays' consistency).

    Raises:
        PayloadError: not an npz archive, too large, unexpected members, missing keys, non-integer or object arrays,
            negative or out-of-vocabulary token ids.
    """
    import io
    import zipfile

    if len(data) > max_bytes:
        raise PayloadError(f"history archive of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise PayloadError(f"history archive is not a valid .npz file: {exc}") from None
    expected = {f"{k}.npy" for k in _STATE_INTS + _STATE_ARRAYS}
    names = {m.filename for m in members}
    if names != expected:
        raise PayloadError(f"history archive members {sorted(names)} differ from the expected {sorted(expected)}")
    declared = sum(m.file_size for m in members)
    if declared > max_bytes:
        raise PayloadError(f"history archive declares {declared} uncompressed bytes, over the limit of {max_bytes}")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            loaded = {k: npz[k] for k in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:  # object arrays raise ValueError here
        raise PayloadError(f"history archive cannot be read without pickle: {exc}") from None
    state: dict = {}
    for key, arr in loaded.items():
        if arr.dtype.kind not in "iu":
            raise PayloadError(f"history archive {key!r} has dtype {arr.dtype}, expected integers")
        if key in _STATE_INTS:
            if arr.ndim != 0:
                raise PayloadError(f"history archive {key!r} must be a scalar")
            state[key] = int(arr)
        else:
            if arr.ndim != 1:
                raise PayloadError(f"history archive {key!r} must be 1-D, got shape {arr.shape}")
            state[key] = arr.copy()  # writeable (arctic's *_ndarray methods reject read-only arrays)
    for key in ("tokens", "tails"):
        arr = state[key]
        if arr.size and (arr.min() < 0 or arr.max() >= 2**31):
            raise PayloadError(f"history archive {key!r} holds token ids outside [0, 2**31)")
        if vocab_size is not None and arr.size and arr.max() >= vocab_size:
            raise PayloadError(f"history archive holds token id {int(arr.max())} outside the vocabulary "
                               f"(size {vocab_size})")
    return state


def encode_history_state(state: dict) -> str:
    """Encode a whole history for ``das_load_history``: ``base64(b"DASH" | npz archive)`` (ASCII ``str``).

    Raises:
        PayloadError: see :func:`history_state_to_bytes`.
    """
    return base64.b64encode(HISTORY_MAGIC + history_state_to_bytes(state)).decode("ascii")


def decode_history_state(payload: str | bytes, vocab_size: int | None = None,
                         max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> dict:
    """Decode :func:`encode_history_state` output (size checked before decoding; nothing unpickled).

    Raises:
        PayloadError: oversized, not base64, wrong magic, or any :func:`history_state_from_bytes` error.
    """
    blob = _unbase64(payload, max_payload_bytes)
    if blob[:4] != HISTORY_MAGIC:
        raise PayloadError("payload does not start with the DASH magic: not a das-trl history state")
    return history_state_from_bytes(blob[4:], vocab_size=vocab_size, max_bytes=max_payload_bytes)
