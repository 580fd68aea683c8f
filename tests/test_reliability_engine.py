"""Reliability cases on a real CPU vLLM engine running DAS (one engine for the module, with a KV cache small enough
that 16 concurrent requests get preempted):

- case 4: the history survives a weight reload and sleep/wake (a no-op on the CPU build), and a history saved by the
  trainer's mirror and loaded into an emptied engine drafts as before (same digest and outputs, accepted draft tokens
  within 5% of the count before the restart, far above the emptied engine's);
- case 5: requests preempted and recomputed by the scheduler, and completions cut at the max model length, with drafts
  from history: no crash, outputs unchanged, no request left active in the drafter;
- case 8: the sampling-parameter table matches the engine (min_p / logit_bias rejected, the engine keeps serving;
  repetition_penalty still gets history drafts accepted).
"""

from __future__ import annotations

import pytest

from engine_utils import MAX_MODEL_LEN, shutdown

pytestmark = pytest.mark.engine

# ~1400 tokens of float32 KV cache for SmolLM2-135M (46 KB/token): room for one max-length request, not for 16
# requests of ~170 tokens at once, so the scheduler must preempt.
KV_BYTES = 64 * 1024**2
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def llm(model_path):
    from vllm import LLM

    from das_trl.vllm.engine import das_engine_kwargs

    engine = LLM(model=model_path, dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_BYTES,
                 disable_log_stats=False, enforce_eager=True, seed=0, **das_engine_kwargs(8))
    yield engine
    shutdown(engine)


@pytest.fixture(scope="module")
def prompts(model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    questions = [f"Count from {i} to {i + 40}, separated by commas." for i in range(16)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in questions]


def _generate(llm, prompts, max_tokens=MAX_TOKENS, **params):
    from vllm import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, **params)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _accepted(llm) -> int:
    from das_trl.vllm.metrics import spec_decode_counters

    return spec_decode_counters(llm)["num_accepted_tokens"]


def _counter(llm, name: str) -> int:
    return int(sum(m.value for m in llm.get_metrics() if m.name == name))


def _accepted_during(llm, fn):
    before = _accepted(llm)
    result = fn()
    return result, _accepted(llm) - before


def test_history_survives_weight_reload_sleep_and_a_restore(llm, prompts, model_path, tmp_path):
    from das_trl.trainer.callback import DASHistoryMirror
    from das_trl.vllm.client import LocalDASEngine

    engine = LocalDASEngine(llm)
    stats = engine.attach({"window": 4, "history_token_budget": 10**6})
    engine.reset("all")
    batch = prompts[:6]
    reference = _generate(llm, batch)
    engine.add_history(batch, reference)
    mirror = DASHistoryMirror(4, 10**6)
    mirror.record(batch, reference)
    assert engine.history_digests() == [mirror.digest()]
    with_history, accepted = _accepted_during(llm, lambda: _generate(llm, batch))
    assert with_history == reference and accepted > 0.5 * sum(map(len, reference))

    # A weight update (vLLM's in-place reload, as the CPU trainer does it) and sleep/wake keep the history.
    reply = llm.collective_rpc("das_reload_weights", kwargs={"weights_path": model_path})
    assert all(r["ok"] for r in reply), reply
    llm.reset_prefix_cache()
    llm.sleep(level=1)
    llm.wake_up()
    assert engine.history_digests() == [mirror.digest()]
    assert engine.stats()["attached"] is True and stats["num_speculative_tokens"] == 8

    # "Restart": the engine loses its history, drafting falls back; the trainer's saved mirror brings it back.
    mirror.save(str(tmp_path))
    engine.reset("history")
    _, accepted_empty = _accepted_during(llm, lambda: _generate(llm, batch))
    restored = DASHistoryMirror(4, 10**6)
    assert restored.load(str(tmp_path))
    reply = engine.load_history(restored.state())
    assert reply["digest"] == mirror.digest() and reply["stats"]["history_sequences"] == 6
    outputs, accepted_restored = _accepted_during(llm, lambda: _generate(llm, batch))
    assert outputs == reference
    # Not always equal to the count before the restart: outputs of the empty-history run linger as finished siblings.
    print(f"accepted draft tokens: with history {accepted}, emptied {accepted_empty}, restored {accepted_restored}")
    assert accepted_empty < 0.95 * accepted <= accepted_restored, (accepted, accepted_empty, accepted_restored)


def test_preempted_requests_and_max_length_cut_with_history_drafts(llm, prompts):
    from das_trl.vllm.client import LocalDASEngine

    engine = LocalDASEngine(llm)
    engine.attach()
    first = _generate(llm, prompts, max_tokens=128)
    preempted_before = _counter(llm, "vllm:num_preemptions")
    engine.add_history(prompts, first)
    second, accepted = _accepted_during(llm, lambda: _generate(llm, prompts, max_tokens=128))
    assert _counter(llm, "vllm:num_preemptions") > preempted_before  # the scheduler did preempt and recompute
    assert accepted > 0 and second == first

    # A prompt that leaves 20 positions: generation stops at the model length, drafts never run past it.
    long_prompt = (prompts[0] * 40)[: MAX_MODEL_LEN - 20]
    cut = _generate(llm, [long_prompt], max_tokens=100, ignore_eos=True)
    assert len(cut[0]) == 20
    engine.add_history([long_prompt], cut)
    again, _ = _accepted_during(llm, lambda: _generate(llm, [long_prompt], max_tokens=100, ignore_eos=True))
    assert again == cut
    # No request of the earlier generations stays active in the drafter (a re-attach used to orphan them; the
    # proposer retires a request on the round after it leaves the batch, so only the last one may remain).
    assert engine.stats()["active_requests"] <= 1


def test_sampling_table_matches_the_engine(llm, prompts):
    from das_trl.vllm.client import LocalDASEngine
    from das_trl.vllm.sampling_check import check_sampling_params

    engine = LocalDASEngine(llm)
    engine.attach()
    for params in ({"min_p": 0.1}, {"logit_bias": {5: 1.0}}):
        assert [i.severity for i in check_sampling_params(params)] == ["error"]
        # vLLM 0.32 rejects these in SamplingParams.verify on some paths; through LLM.generate on the CPU build they
        # were accepted and silently not applied (its logits-processor loader warns "won't work with speculative
        # decoding"). Either way the parameter does not do what the user asked, hence "error" before the run.
        try:
            _generate(llm, prompts[:1], **params)
        except Exception as exc:  # noqa: BLE001 - the rejection wording is vLLM's
            assert "speculative decoding" in str(exc)
    # The engine keeps serving; a penalty is a "note": drafts are still verified and accepted.
    assert [i.severity for i in check_sampling_params({"repetition_penalty": 1.2})] == ["note"]
    batch = prompts[6:10]
    penalized = _generate(llm, batch, repetition_penalty=1.2)
    engine.add_history(batch, penalized)
    again, accepted = _accepted_during(llm, lambda: _generate(llm, batch, repetition_penalty=1.2))
    assert again == penalized and accepted > 0
