"""Helpers for tests that start real CPU vLLM engines (imported by test modules; fixtures live in conftest.py)."""

from __future__ import annotations

import os

# An explicit, small KV cache: several engines may be alive at once on a 24 GiB CI machine, and on CPU builds a
# memory *fraction* is counted against the whole process's RSS (negative once the model is loaded).
KV_CACHE_BYTES = int(os.environ.get("DAS_TRL_TEST_KV_BYTES", str(512 * 1024**2)))
MAX_MODEL_LEN = 1024


def make_llm(model_path: str, das: bool = False, num_speculative_tokens: int = 8, **kwargs):
    """A real CPU vLLM engine with the packaged model; ``das=True`` adds the DAS proposer and worker extension."""
    from vllm import LLM

    from das_trl.vllm.engine import das_engine_kwargs

    extra = das_engine_kwargs(num_speculative_tokens) if das else {}
    extra.update(kwargs)
    return LLM(
        model=model_path,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        disable_log_stats=False,
        enforce_eager=True,
        seed=0,
        **extra,
    )


def shutdown(llm) -> None:
    """Release an engine (its engine-core process and memory) before the next one starts."""
    from das_trl.bench.live import shutdown_engine

    shutdown_engine(llm)
