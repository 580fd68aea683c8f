"""Every verification step within what the engine's memory profile ran: the per-engine draft limits and the profile
hook that runs the verification path with logprobs at that shape.

vLLM sizes a GPU's KV cache from the peak memory of one profile run (``GPUModelRunner.profile_run``, vLLM 0.32 and
0.33.0): a forward of ``max_num_batched_tokens`` tokens, then ``GPUModelRunner._dummy_sampler_run``, which samples
``N = min(max_num_seqs, max_num_batched_tokens)`` rows and calls the rejection sampler with **one draft token per row
and no logprobs** (``max_num_logprobs=None``). A step that verifies more positions, or asks for logprobs (TRL always
does), needs memory the profile never saw; the KV cache took the rest, so a long-draft step can run out of memory
mid-training. das-trl's answer, per engine:

* **A limit on draft tokens per step**, ``D`` (:func:`verification_limits`): by default the larger of ``N`` (the
  draft tokens vLLM's own profile ran through the rejection sampler) and ``FULL_DRAFTS_PROFILED x K`` (room for that
  many rows drafting the full cap ``K`` at once, so a small batch's tail rows keep their long drafts: with ``N``
  alone, an engine sized for 8 rollouts would verify 8 draft tokens per step), within ``max_num_batched_tokens``;
  a step verifies at most ``N + D`` positions, and the profile hook below runs that shape. The step cap enforces it (:class:`~das_trl.vllm.speculator.Speculator`, ``max_step_drafts``); the
  budget controller's plan decides which rows' drafts fill it. ``DAS_TRL_VERIFY_DRAFT_TOKENS`` sets another ``D``
  (the profile hook then reserves it).
* **The padded shape.** Where vLLM's logprob path is not patched (:mod:`das_trl.vllm.verification_logprobs`
  reports ``"padded"``), logprobs cost ``rows x (longest draft + 1)``: the longest draft is capped at ``D // N``
  (1 by default), so the padded rows stay within ``N + D`` too.
* **The profile hook** (:func:`install_profile_hook`): on an engine running the DAS proposer, after vLLM's own
  dummy sampler run, the rejection sampler runs once more with logprobs at the largest shape the proposer may send
  (``N`` rows, ``D`` draft tokens spread over them, vLLM's dummy sampling parameters: top-k and top-p, the costliest
  path). vLLM's profiler records that peak, so the KV cache leaves room for it; the same call runs again in the
  sampler warm-up after the KV cache is allocated, where a shortfall fails at start rather than mid-training.

The CPU build has no memory profile (its KV cache is a fixed ``kv_cache_memory_bytes``): no limit there unless
``DAS_TRL_VERIFY_DRAFT_TOKENS`` is set. Rows admitted in a step add one position each (within ``N`` rows); vLLM's
admission padding (a request admitted with one token left to compute gets ``K`` placeholder drafts,
``Scheduler.schedule``, "Pad new decode requests to uniform spec decoding size") adds ``K`` positions that the
proposer never sends (``docs/gpu.md``).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, replace
from typing import Any

import torch

logger = logging.getLogger("vllm.das_trl.verification_profile")

ENV_VAR = "DAS_TRL_VERIFY_DRAFT_TOKENS"
#: Rows drafting the full cap K that the default limit leaves room for: 8 x 64 = 512 draft tokens, whose verification
#: with logprobs holds a few float32 copies of [512, vocab] (about 1.5 GB at Qwen2's 151,936), reserved by the hook.
FULL_DRAFTS_PROFILED = 8
#: top logprobs per position the profile asks for (TRL asks 0; a top-k output is ``[positions, k + 1]``, small)
PROFILE_NUM_LOGPROBS = 20

_hooked: set[type] = set()


@dataclass(frozen=True)
class VerificationLimits:
    """What one engine step may verify so it stays within the profiled shape.

    Attributes:
        profiled_rows: ``N``, the rows vLLM's profile sampled (``min(max_num_seqs, max_num_batched_tokens)``).
        draft_tokens: ``D``, the most draft tokens per step (``None``: no limit, the CPU build).
        longest_draft: the most draft tokens of one row (``None``: no limit; ``D // N`` on the padded shape).
        source: where ``D`` comes from: ``"profile"`` (the default: ``max(N, FULL_DRAFTS_PROFILED x K)`` within
            ``max_num_batched_tokens``, run by the profile hook), ``"DAS_TRL_VERIFY_DRAFT_TOKENS"``,
            or ``"none: CPU build (no memory profile)"``.
    """

    profiled_rows: int
    draft_tokens: int | None
    longest_draft: int | None
    source: str


def profiled_rows(vllm_config: Any) -> int | None:
    """``N``: the rows ``GPUModelRunner._dummy_sampler_run`` samples in the profile run (its ``_dummy_run`` of
    ``max_num_batched_tokens`` tokens spreads them over ``min(max_num_seqs, max_num_batched_tokens)`` requests);
    ``None`` when the config does not say."""
    sched = getattr(vllm_config, "scheduler_config", None)
    sizes = [getattr(sched, name, None) for name in ("max_num_seqs", "max_num_batched_tokens")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
        return None
    return max(1, min(sizes))


def _env_draft_tokens(environ: dict[str, str]) -> int | None:
    text = environ.get(ENV_VAR, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{ENV_VAR}={text!r}: expected an integer >= 0 (draft tokens verified per engine step; "
                         f"unset: the rows vLLM's memory profile ran). Next step: unset it or give a count.")
    return value


def verification_limits(vllm_config: Any, shape: str, cpu: bool,
                        environ: dict[str, str] | None = None) -> VerificationLimits | None:
    """The engine's :class:`VerificationLimits` (``None`` when its config has no scheduler sizes: not a vLLM
    engine's).

    Args:
        vllm_config: the engine's ``VllmConfig`` (``scheduler_config.max_num_seqs``, ``max_num_batched_tokens``).
        shape: ``"patched"`` or ``"padded"`` (:func:`das_trl.vllm.verification_logprobs.verification_shape`).
        cpu: whether the engine runs on vLLM's CPU build (no memory profile: no limit unless the variable is set).
        environ: the environment (default ``os.environ``), for ``DAS_TRL_VERIFY_DRAFT_TOKENS``.

    Raises:
        ValueError: ``shape`` is not one of the two, or ``DAS_TRL_VERIFY_DRAFT_TOKENS`` is not an integer >= 0.
    """
    if shape not in ("patched", "padded"):
        raise ValueError(f"shape must be 'patched' or 'padded', got {shape!r}")
    rows = profiled_rows(vllm_config)
    if rows is None:
        return None
    drafts = _env_draft_tokens(os.environ if environ is None else environ)
    source = ENV_VAR
    if drafts is None:
        if cpu:
            return VerificationLimits(rows, None, None, "none: CPU build (no memory profile)")
        spec = getattr(vllm_config, "speculative_config", None)
        k = getattr(spec, "num_speculative_tokens", None)
        k = k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 0
        budget = vllm_config.scheduler_config.max_num_batched_tokens
        drafts, source = min(max(rows, FULL_DRAFTS_PROFILED * k), budget), "profile"
    return VerificationLimits(rows, drafts, drafts // rows if shape == "padded" else None, source)


def spread_drafts(draft_tokens: int, rows: int) -> list[int]:
    """``draft_tokens`` spread over ``rows`` rows as evenly as they go (the first rows take the remainder)."""
    base, extra = divmod(int(draft_tokens), int(rows))
    return [base + (i < extra) for i in range(rows)]


def run_verification_profile(rejection_sampler: Any, sampling_metadata: Any, rows: int, draft_tokens: int,
                             vocab_size: int, dtype: torch.dtype, device: torch.device,
                             num_logprobs: int = PROFILE_NUM_LOGPROBS) -> Any:
    """Run ``rejection_sampler`` once at the largest verification shape: ``rows`` rows, ``draft_tokens`` draft
    tokens spread over them, random logits, ``sampling_metadata`` (vLLM's dummy, of ``rows`` rows) with logprobs.

    Returns:
        the sampler's ``SamplerOutput`` (the caller drops it).
    """
    from das_trl.vllm.verification_logprobs import make_metadata

    drafts = [[0] * n for n in spread_drafts(draft_tokens, rows)]
    metadata = make_metadata(drafts, device)
    logits = torch.randn(rows + draft_tokens, vocab_size, device=device, dtype=dtype)
    return rejection_sampler(metadata, None, logits, replace(sampling_metadata, max_num_logprobs=num_logprobs))


def _with_verification_profile(original: Any) -> Any:
    """``GPUModelRunner._dummy_sampler_run`` followed, on a DAS engine, by :func:`run_verification_profile` with
    the rows and sampling parameters of vLLM's own rejection-sampler call (captured, not rebuilt, so the hook does
    not depend on the fields of ``SamplingMetadata``)."""

    @functools.wraps(original)
    def _dummy_sampler_run(self: Any, hidden_states: torch.Tensor) -> Any:
        limits = getattr(getattr(self, "drafter", None), "verification_limits", None)
        sampler = getattr(self, "rejection_sampler", None)
        if not isinstance(limits, VerificationLimits) or limits.draft_tokens is None or sampler is None:
            return original(self, hidden_states)
        seen: list[tuple[Any, int, int, torch.dtype, torch.device]] = []

        def forward(metadata: Any, draft_probs: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
            if not seen:  # shapes and parameters only: holding the logits would change vLLM's own peak
                seen.append((sampling_metadata, len(metadata.num_draft_tokens), logits.shape[-1], logits.dtype,
                             logits.device))
            return type(sampler).forward(sampler, metadata, draft_probs, logits, sampling_metadata)

        sampler.forward = forward
        try:
            output = original(self, hidden_states)
        finally:
            del sampler.forward
        if seen:
            sampling_metadata, rows, vocab, dtype, device = seen[0]
            run_verification_profile(sampler, sampling_metadata, rows, limits.draft_tokens, vocab, dtype, device)
            if device.type != "cpu" and hasattr(torch, "accelerator"):
                torch.accelerator.synchronize()
        return output

    _dummy_sampler_run.__das_verification_profile__ = True
    return _dummy_sampler_run


def install_profile_hook(runner_cls: type | None = None) -> bool:
    """Wrap ``runner_cls._dummy_sampler_run`` (default: vLLM's ``GPUModelRunner``) with the verification profile.

    Called by :class:`~das_trl.vllm.proposer.DASProposer` when it is built (inside the model runner's constructor,
    before the profile run); the wrapper does nothing on a runner whose drafter is not a DAS proposer with a limit.
    Idempotent. Returns whether the class is hooked.
    """
    if runner_cls is None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as runner_cls
    method = runner_cls.__dict__.get("_dummy_sampler_run")
    if method is None:
        return False
    if not getattr(method, "__das_verification_profile__", False):
        runner_cls._dummy_sampler_run = _with_verification_profile(method)
        _hooked.add(runner_cls)
        logger.info("das_trl: %s._dummy_sampler_run also profiles verification with logprobs at the DAS engine's "
                    "largest step", runner_cls.__name__)
    return True


def uninstall_profile_hook(runner_cls: type) -> None:
    """Restore ``runner_cls._dummy_sampler_run`` (for tests)."""
    method = runner_cls.__dict__.get("_dummy_sampler_run")
    if getattr(method, "__das_verification_profile__", False):
        runner_cls._dummy_sampler_run = method.__wrapped__
    _hooked.discard(runner_cls)
