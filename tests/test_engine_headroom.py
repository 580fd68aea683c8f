"""The colocated DAS engine's sizes on a real CPU vLLM engine: ``das_vllm_kwargs`` overrides TRL's engine arguments,
and the model-length headroom keeps vLLM from replacing DAS's drafts with placeholders.

vLLM 0.32/0.33 call the drafter only when every running row's length + K fits ``max_model_len``
(``GPUModelRunner._input_fits_in_drafter``); otherwise every row of the step gets K zero-token placeholder drafts
(``sample_tokens``, "Zero out draft tokens"), verified next step and rejected. vLLM's spec-decode counters count those
as verified draft tokens; DAS's own counters count only the drafts it proposed. The difference is the placeholders.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine_utils import KV_CACHE_BYTES

pytestmark = pytest.mark.engine

K = 8
COMPLETION = 48


class _Policy(torch.nn.Module):
    """What the colocate path reads from the policy: its path, modules (quantization) and parameter dtype."""

    def __init__(self, path: str):
        super().__init__()
        self.name_or_path = path
        self.proj = torch.nn.Linear(2, 2)


def _generation(model_path: str, monkeypatch, **das):
    """A ``DASVLLMGeneration`` ready for ``_init_colocate`` with the packaged model (no trainer)."""
    from das_trl.trainer.config import das_settings
    from das_trl.trainer.generation import DASVLLMGeneration

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)  # TRL's ensure_master_addr_port picks a free one
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    gen = object.__new__(DASVLLMGeneration)
    settings = das_settings(SimpleNamespace())
    settings.update({"num_speculative_tokens": K, **das})
    gen.das, gen.engine, gen.model, gen.mode = settings, None, _Policy(model_path), "colocate"
    gen.accelerator = SimpleNamespace(process_index=0, local_process_index=0, num_processes=1, mixed_precision="no")
    gen.tensor_parallel_size, gen.gpu_memory_utilization, gen.max_model_length = 1, 0.3, None
    gen.max_num_seqs, gen.enable_sleep_mode, gen.model_impl, gen.trust_remote_code = 8, False, "auto", False
    gen.max_completion_length = COMPLETION
    return gen


def _rows(tokenizer) -> list[tuple[list[int], int]]:
    """Four prompts of different lengths, each with ``COMPLETION`` tokens to generate."""
    prompts = [tokenizer(f"Count: {' '.join(str(i) for i in range(s, s + 12))}")["input_ids"] for s in range(4)]
    prompts.append(tokenizer("Count: 1 2 3")["input_ids"])
    return [(p, COMPLETION) for p in prompts]


def _placeholder_run(gen) -> dict:
    """Generate the rows greedily twice (the first pass fills DAS's history), count the second pass's drafts."""
    from vllm import SamplingParams

    from das_trl.vllm.metrics import spec_decode_counters

    llm, engine = gen.llm, gen.engine
    rows = _rows(llm.get_tokenizer())
    params = [SamplingParams(max_tokens=c, temperature=0.0, ignore_eos=True) for _, c in rows]
    requests = [{"prompt_token_ids": p} for p, _ in rows]
    first = [list(o.outputs[0].token_ids) for o in llm.generate(requests, params, use_tqdm=False)]
    engine.add_history([p for p, _ in rows], first)
    engine.reset("counters")
    before = spec_decode_counters(llm)
    second = [list(o.outputs[0].token_ids) for o in llm.generate(requests, params, use_tqdm=False)]
    after = spec_decode_counters(llm)
    stats = engine.stats()
    verified = after["num_draft_tokens"] - before["num_draft_tokens"]
    return {"longest": max(len(p) + c for p, c in rows), "verified": verified, "proposed": stats["draft_tokens"],
            "placeholders": verified - stats["draft_tokens"], "identical": second == first}


def test_das_vllm_kwargs_set_the_engine_and_headroom_removes_placeholder_drafts(model_path, monkeypatch):
    from transformers import AutoTokenizer

    rows = _rows(AutoTokenizer.from_pretrained(model_path))
    longest = max(len(p) + c for p, c in rows)
    base = {"kv_cache_memory_bytes": KV_CACHE_BYTES, "enforce_eager": True}

    # das_vllm_kwargs overrides TRL's engine arguments (max_num_batched_tokens=4096 and max_model_len were passed
    # twice before: "got multiple values for keyword argument"); here: no headroom at all.
    gen = _generation(model_path, monkeypatch,
                      vllm_kwargs={**base, "max_num_batched_tokens": 8192, "max_model_len": longest})
    gen._init_colocate()
    try:
        config = gen.llm.llm_engine.vllm_config
        assert config.scheduler_config.max_num_batched_tokens == 8192
        assert config.model_config.max_model_len == longest
        assert gen.engine.limits == {"max_model_len": longest, "max_num_batched_tokens": 8192,
                                     "num_speculative_tokens": K}
        tight = _placeholder_run(gen)
        advice = gen.headroom_advice(1, len(rows), max(len(p) for p, _ in rows))
    finally:
        gen.shutdown()
    # vLLM verified draft tokens that DAS never proposed: K zero tokens per row on every step it skipped the drafter.
    assert tight["placeholders"] > 0, tight
    assert tight["identical"], tight  # placeholders are rejected: still lossless, only wasted
    assert f"das_vllm_kwargs['max_model_len'] to {longest + K} or more" in advice

    # TRL's own setting, vllm_max_model_length = the longest prompt + completion: das-trl adds K.
    gen = _generation(model_path, monkeypatch, vllm_kwargs=base)
    gen.max_model_length = longest
    gen._init_colocate()
    try:
        config = gen.llm.llm_engine.vllm_config
        assert config.model_config.max_model_len == longest + K
        assert config.scheduler_config.max_num_batched_tokens == 4096  # the CPU build keeps TRL's value
        roomy = _placeholder_run(gen)
    finally:
        gen.shutdown()
    print("placeholder drafts without / with headroom:", tight, roomy)  # shown with pytest -s
    assert roomy["placeholders"] == 0, roomy
    assert roomy["proposed"] > 0 and roomy["identical"], roomy
