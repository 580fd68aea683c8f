"""Verification as a real CPU engine runs it, with das-trl's logprob patch and its admission switch.

* The DAS engine at the default K, half of its prompts with a converged history (long drafts) and half without
  (short or none), so steps verify rows of very different draft lengths: greedy outputs, and logprobs with
  ``logprobs=0`` and ``=5``, are those of the engine without speculation, and the worker computed them with the
  patched function (rows of at most 4 and 16+ draft tokens in one step were seen by it).
* vLLM's admission padding: a request admitted with one token left (a 129-token prompt whose first 128-token KV block
  a sibling cached) gets K placeholder drafts, K verified positions per sibling; after
  :func:`~das_trl.vllm.admission_padding.unpad_admissions` it gets none, and outputs do not change.

The DAS engine's core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the test can read its scheduler
and see the worker's rejection sampler.
"""

from __future__ import annotations

import os

import pytest

from engine_utils import make_llm, shutdown

from das_trl.vllm.engine import DEFAULT_NUM_SPECULATIVE_TOKENS as K

pytestmark = pytest.mark.engine

MAX_TOKENS = 40
NUM_PROMPTS = 8
ADMISSION_TOKENS = 4  # the padding happens at admission: a few tokens show it
LOGPROB_TOLERANCE = 2e-3  # float32 verification vs one token at a time: accumulation order only (test_engine_das)
BLOCK = 128  # the CPU build's KV block size (vllm/platforms/cpu.py)
SIBLINGS = 4


def _prompts(tokenizer) -> list[list[int]]:
    questions = [f"Count from {i} to {i + 15}, separated by commas." for i in range(NUM_PROMPTS // 2)]
    questions += [f"List the first {i + 4} even numbers, one per line." for i in range(NUM_PROMPTS // 2)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in questions]


def _aligned_prompts(tokenizer) -> list[list[int]]:
    """Two prompts of BLOCK + 1 tokens: a sibling finds all but the last token in the prefix cache."""
    out = []
    for topic in ("rivers", "mountains"):
        ids = tokenizer(" ".join(f"Fact {j} about {topic}: it is long and old." for j in range(40)))["input_ids"]
        out.append(list(ids)[: BLOCK + 1])
    return out


def _generate(llm, prompts, num_logprobs, max_tokens=MAX_TOKENS):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=num_logprobs)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outputs]


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="module")
def reference(model_path, tokenizer):
    """The engine without speculation: outputs with logprobs 0 and 5, and the aligned prompts' outputs."""
    llm = make_llm(model_path, das=False)
    try:
        prompts = _prompts(tokenizer)
        return {"prompts": prompts, 0: _generate(llm, prompts, 0), 5: _generate(llm, prompts, 5),
                "aligned": [_generate(llm, [p], 0, ADMISSION_TOKENS)[0][0] for p in _aligned_prompts(tokenizer)]}
    finally:
        shutdown(llm)


@pytest.fixture(scope="module")
def das_llm(model_path, reference):  # after the reference: its shutdown tears down this process's parallel state
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        llm = make_llm(model_path, das=True, num_speculative_tokens=K)
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old
    yield llm
    shutdown(llm)


def _assert_same_logprobs(got, want, num_logprobs):
    for (tokens, lps), (ref_tokens, ref_lps) in zip(got, want):
        assert tokens == ref_tokens
        assert len(lps) == len(ref_lps) == len(tokens)
        for token, at, ref in zip(tokens, lps, ref_lps):
            assert abs(at[token].logprob - ref[token].logprob) < LOGPROB_TOLERANCE
            assert at[token].rank == ref[token].rank
            assert len(at) == len(ref) <= num_logprobs + 1
            for t in set(at) & set(ref):
                assert abs(at[t].logprob - ref[t].logprob) < LOGPROB_TOLERANCE
            # a top-k id present on one side only is a tie at the k-th value
            kth = min(v.logprob for v in ref.values())
            for t in set(at) ^ set(ref):
                assert abs((at.get(t) or ref.get(t)).logprob - kth) < LOGPROB_TOLERANCE


def test_mixed_draft_lengths_give_the_plain_engines_outputs_and_logprobs(das_llm, reference, monkeypatch):
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from das_trl.vllm import verification_logprobs as vl
    from das_trl.vllm.client import LocalDASEngine

    engine = LocalDASEngine(das_llm)
    engine.attach()
    engine.reset("all")
    stats = engine.stats()
    assert stats["verification_shape"] == "patched"  # the worker's own word
    assert RejectionSampler._get_logprobs_tensors is vl.logprobs_at_verified_positions  # the worker is in-process
    steps = []

    def recording(self, n, metadata, *args):
        steps.append(list(metadata.num_draft_tokens))
        return vl.logprobs_at_verified_positions(self, n, metadata, *args)

    monkeypatch.setattr(RejectionSampler, "_get_logprobs_tensors", recording)
    prompts = reference["prompts"]
    half = NUM_PROMPTS // 2
    engine.add_history(prompts[:half], [t for t, _ in reference[0][:half]])  # converged: these draft long
    for num_logprobs in (0, 5):
        _assert_same_logprobs(_generate(das_llm, prompts, num_logprobs), reference[num_logprobs], num_logprobs)
    mixed = [s for s in steps if max(s) >= 16 and min(s) <= 4]
    assert mixed, f"no step verified rows of at most 4 and 16+ draft tokens: {steps[:20]}"
    assert engine.stats()["peak_draft_len"] >= 16


def test_admission_padding_and_unpad_admissions(das_llm, reference, tokenizer):
    from das_trl.vllm.admission_padding import unpad_admissions
    from das_trl.vllm.client import LocalDASEngine
    from das_trl.vllm.metrics import spec_decode_counters

    engine = LocalDASEngine(das_llm)
    engine.detach()  # the proposer drafts nothing: every draft token counted below is vLLM's placeholder
    scheduler = das_llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.admissions_unpadded  # das-trl's scheduler turns the padding off on its own
    scheduler.dynamic_sd_lookup = None  # vLLM's behaviour, whatever das-trl's scheduler chose
    placeholders = []
    for prompt, ref_tokens, unpad in zip(_aligned_prompts(tokenizer), reference["aligned"], (False, True)):
        if unpad:
            assert unpad_admissions(scheduler)
        assert _generate(das_llm, [prompt], 0, ADMISSION_TOKENS)[0][0] == ref_tokens  # caches the prompt's first block
        before = spec_decode_counters(das_llm)
        outputs = _generate(das_llm, [prompt] * SIBLINGS, 0, ADMISSION_TOKENS)
        after = spec_decode_counters(das_llm)
        assert [t for t, _ in outputs] == [ref_tokens] * SIBLINGS
        placeholders.append(after["num_draft_tokens"] - before["num_draft_tokens"])
        assert after["num_accepted_tokens"] == before["num_accepted_tokens"]
    assert placeholders == [SIBLINGS * K, 0]
