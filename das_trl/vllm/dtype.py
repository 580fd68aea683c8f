"""Which dtype the rollout engine computes in: the trainer's compute dtype unless the user chose one.

vLLM's ``dtype="auto"`` downcasts a float32 checkpoint to bfloat16 (on CPU builds and on GPUs), so a trainer computing
in float32 (the packaged SmolLM2-135M-Instruct is float32, ``bf16=False``) got rollouts sampled in bfloat16: processed
logprobs 2.5e-2 nats apart from the trainer's on average, 0.55 at worst, against ~1e-5 / ~2e-3 with a float32
engine (docs/reliability.md, "Rollouts are sampled in the trainer's precision", has a two-step GRPO measurement).
TRL's ``sampling/sampling_logp_difference`` showed it at every step and could not be told from a drafter fault. The
rules here:

* colocate mode (:func:`colocate_engine_dtype`): ``das_vllm_kwargs["dtype"]`` when set, else the trainer's compute
  dtype (:func:`trainer_compute_dtype`: bfloat16 / float16 under accelerate mixed precision, else the policy's
  parameter dtype);
* ``das-trl serve`` (:func:`serve_engine_dtype`): ``--dtype`` when given, else the checkpoint's own dtype from its
  ``config.json``, which is what a TRL trainer loads the policy in (``dtype`` is inferred from the checkpoint since
  Transformers v5); a trainer with mixed precision should pass ``--dtype bfloat16``, and the trainer warns when a
  server's dtype differs from its compute dtype (:func:`dtype_mismatch_message`).

Every choice is logged with its reason.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

#: Canonical names (vLLM's ``dtype`` argument accepts these) of the dtypes a checkpoint or policy may have.
_NAMES = {"float32": "float32", "float": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "half": "float16", "fp16": "float16"}


def dtype_name(dtype: Any) -> str | None:
    """Canonical name (``"float32"``, ``"bfloat16"``, ``"float16"``) of a ``torch.dtype`` or a dtype string
    (``"torch.float32"``, ``"bf16"``, ...); ``None`` for anything else (``"auto"``, ``None``, other dtypes)."""
    if dtype is None:
        return None
    text = str(dtype).lower().removeprefix("torch.")
    return _NAMES.get(text)


def trainer_compute_dtype(model: Any, mixed_precision: str | None = "no") -> str | None:
    """The dtype the trainer computes logprobs in.

    Args:
        model: the policy (``torch.nn.Module``; a PEFT model too). Its ``dtype`` attribute, else its first
            floating-point parameter's dtype, is used.
        mixed_precision: accelerate's ``mixed_precision`` (``"no"``, ``"bf16"``, ``"fp16"``, ``"fp8"``); bf16 and
            fp16 autocast the forward pass, so they win over the parameter dtype.

    Returns:
        ``"bfloat16"`` / ``"float16"`` / ``"float32"``, or ``None`` when it cannot be told.
    """
    if mixed_precision in ("bf16", "fp16"):
        return "bfloat16" if mixed_precision == "bf16" else "float16"
    name = dtype_name(getattr(model, "dtype", None))
    if name is None and hasattr(model, "parameters"):
        for param in model.parameters():
            if param.is_floating_point():
                return dtype_name(param.dtype)
    return name


def colocate_engine_dtype(vllm_kwargs: dict[str, Any] | None, model: Any,
                          mixed_precision: str | None = "no") -> tuple[str, str]:
    """The colocated engine's ``dtype`` argument and why (logged by the caller).

    Args:
        vllm_kwargs: ``das_vllm_kwargs`` (a ``"dtype"`` there is the user's choice and is kept as given).
        model, mixed_precision: see :func:`trainer_compute_dtype`.

    Returns:
        ``(dtype, reason)``: ``dtype`` is what to pass to ``vllm.LLM`` (``"auto"`` only when the trainer's dtype
        cannot be told).
    """
    if vllm_kwargs and vllm_kwargs.get("dtype") is not None:
        return str(vllm_kwargs["dtype"]), "set by das_vllm_kwargs"
    compute = trainer_compute_dtype(model, mixed_precision)
    if compute is None:
        return "auto", "the trainer's compute dtype is unknown: vLLM's 'auto'"
    return compute, f"the trainer's compute dtype (policy {dtype_name(getattr(model, 'dtype', None)) or '?'}, " \
                    f"mixed precision {mixed_precision or 'no'}); set das_vllm_kwargs={{'dtype': ...}} to override"


def checkpoint_dtype(model: str) -> str | None:
    """The dtype a checkpoint stores its weights in (``config.json``'s ``dtype`` or ``torch_dtype``).

    Args:
        model: a local model directory, or a hub name (read with ``transformers.AutoConfig``; needs the hub or its
            cache).

    Returns:
        The canonical name, or ``None`` when the config cannot be read or names no known dtype.
    """
    path = os.path.join(model, "config.json")
    try:
        if os.path.isfile(path):
            with open(path) as f:
                config = json.load(f)
            return dtype_name(config.get("dtype") or config.get("torch_dtype"))
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model)
        return dtype_name(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None))
    except Exception:  # noqa: BLE001 - unreadable config: the caller falls back to vLLM's 'auto'
        return None


def serve_engine_dtype(requested: str | None, model: str) -> tuple[str, str]:
    """``das-trl serve``'s ``--dtype`` and why.

    Args:
        requested: the ``--dtype`` given (``None``: not given).
        model: the model path or hub name served.

    Returns:
        ``(dtype, reason)``: the user's value; else the checkpoint's dtype (what a TRL trainer computes in without
        mixed precision); else ``"auto"``.
    """
    if requested is not None:
        return requested, "set by --dtype"
    found = checkpoint_dtype(model)
    if found is None:
        return "auto", "the checkpoint's dtype is unknown: vLLM's 'auto'"
    return found, ("the checkpoint's dtype, which a TRL trainer computes in without mixed precision (trainers "
                   "with bf16=True: pass --dtype bfloat16)")


def dtype_mismatch_message(engine_dtype: str | None, compute_dtype: str | None) -> str | None:
    """A warning when an engine samples in another dtype than the trainer computes in; ``None`` when they agree or
    either is unknown."""
    engine, compute = dtype_name(engine_dtype), dtype_name(compute_dtype)
    if engine is None or compute is None or engine == compute:
        return None
    return (f"the vLLM engine computes in {engine} but the trainer in {compute}: sampling logprobs will differ from "
            f"the trainer's by the {engine}/{compute} rounding (TRL's sampling/sampling_logp_difference shows it), "
            f"which is not a DAS fault. Start the server with `das-trl serve --dtype {compute}` (or set the "
            "trainer's precision to match).")
