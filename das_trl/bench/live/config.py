"""What one live A/B run does: the drafters it compares and its settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from das_trl.bench.options import int_in_range
from das_trl.vllm.engine import DEFAULT_NUM_SPECULATIVE_TOKENS

#: The drafters the live A/B can run, each as vLLM runs it (:func:`~das_trl.bench.live.engine.speculative_kwargs`).
DRAFTERS = ("none", "ngram", "suffix", "das")

#: The ``dtype`` values vLLM's model config accepts (``auto`` and the keys of its ``_STR_DTYPE_TO_TORCH_DTYPE``): the
#: ``--dtype`` choices of the benches that start an engine with it (``bench live``, ``record``, ``task-spread``).
VLLM_DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")

#: The largest seed vLLM takes (it seeds numpy's legacy generator, which needs ``0 <= seed <= 2**32 - 1``).
MAX_SEED = 2**32 - 1


#: argparse ``type=`` of a seed that reaches a vLLM engine (a negative one failed only once the engine started:
#: "Seed must be between 0 and 2**32 - 1").
engine_seed = int_in_range(0, MAX_SEED)


@dataclass
class LiveConfig:
    """What one ``das-trl bench live`` run does (see :func:`parse_args` for the meaning of each field)."""

    model: str | None = None
    drafters: tuple[str, ...] = DRAFTERS
    task: str = "gsm_symbolic"
    prompts: int = 8
    samples: int = 4
    max_tokens: int = 64
    temperature: float = 0.8
    greedy: bool = False
    history: str | None = None
    warm_epochs: int = 1
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    das_config: dict[str, Any] | None = None
    seed: int = 0
    dtype: str = "float32"
    max_model_len: int = 1024
    kv_cache_bytes: int = 1 << 30
    gpu_memory_utilization: float = 0.85
    max_num_seqs: int = 256
    enforce_eager: bool | None = None
    time_limit_s: float | None = None
