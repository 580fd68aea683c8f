"""The DAS proposer inside a real CPU vLLM engine with the real packaged model.

Lossless at the default K: greedy outputs are token-identical with and without DAS, and returned logprobs match;
drafts come from the pushed history (vLLM's own spec_decode counters); an unattached proposer drafts nothing and says
so; a bad payload is rejected while the engine keeps serving; a step never offers more tokens than the engine's
``max_num_batched_tokens`` schedules.
"""

from __future__ import annotations

import pytest

from engine_utils import make_llm, shutdown

from das_trl.vllm.engine import DEFAULT_NUM_SPECULATIVE_TOKENS as K

pytestmark = pytest.mark.engine

NUM_PROMPTS = 16
MAX_TOKENS = 48
# float32 on CPU: verification scores several positions in one forward pass, the reference one at a time; the
# difference is accumulation order only (engine-vs-HF float32 agreement on this model was ~3e-5 nats).
LOGPROB_TOLERANCE = 2e-3


def _prompts(tokenizer) -> list[list[int]]:
    questions = [f"Count from {i} to {i + 12}, separated by commas." for i in range(8)]
    questions += [f"Write the multiplication table of {i} up to {i} x 6." for i in range(2, 10)]
    assert len(questions) == NUM_PROMPTS
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False)
        for q in questions
    ]


def _generate(llm, prompts, **params):
    from vllm import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0, **params)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outputs]
    return tokens, logprobs


@pytest.fixture(scope="module")
def reference(model_path):
    """Greedy outputs and logprobs of the engine without speculation."""
    from transformers import AutoTokenizer

    prompts = _prompts(AutoTokenizer.from_pretrained(model_path))
    llm = make_llm(model_path, das=False)
    tokens, logprobs = _generate(llm, prompts)
    shutdown(llm)
    return prompts, tokens, logprobs


@pytest.fixture(scope="module")
def das_llm(model_path, reference):
    llm = make_llm(model_path, das=True, num_speculative_tokens=K)
    yield llm
    shutdown(llm)


def test_unattached_proposer_drafts_nothing_and_says_so(das_llm, reference):
    from das_trl.vllm.client import LocalDASEngine
    from das_trl.vllm.metrics import spec_decode_counters

    engine = LocalDASEngine(das_llm)
    engine.detach()
    engine.reset("all")
    before = spec_decode_counters(das_llm)["num_draft_tokens"]
    prompts, ref_tokens, _ = reference
    tokens, _ = _generate(das_llm, prompts[:4])
    stats = engine.stats()
    assert stats["attached"] is False
    assert stats["unattached_rounds"] > 0
    assert stats["draft_tokens"] == 0
    assert spec_decode_counters(das_llm)["num_draft_tokens"] == before
    assert tokens == ref_tokens[:4]


def test_greedy_identical_and_history_drafts_accepted(das_llm, reference):
    from das_trl.vllm.client import LocalDASEngine
    from das_trl.vllm.metrics import spec_decode_counters

    prompts, ref_tokens, ref_logprobs = reference
    engine = LocalDASEngine(das_llm)
    engine.attach()
    engine.reset("all")

    # Round 1, empty history: only the prompt/local trees can draft.
    tokens, logprobs = _generate(das_llm, prompts)
    assert tokens == ref_tokens
    accepted_before = spec_decode_counters(das_llm)["num_accepted_tokens"]

    # Push the rollouts as a trainer step would; the same prompts now draft from history.
    reply = engine.add_history(prompts, tokens)
    assert reply["added"]["sequences"] == NUM_PROMPTS
    assert reply["stats"]["history_problems"] == NUM_PROMPTS
    tokens2, logprobs2 = _generate(das_llm, prompts)
    counters = spec_decode_counters(das_llm)
    assert tokens2 == ref_tokens
    assert counters["num_accepted_tokens"] > accepted_before
    # Greedy decoding repeats the history exactly: most output tokens should come from accepted drafts.
    gained = counters["num_accepted_tokens"] - accepted_before
    assert gained >= 0.5 * sum(len(t) for t in ref_tokens), counters
    # The proposer reported the verification outcomes back: the drafter's acceptance calibration learned from them.
    assert engine.stats()["calibration_tokens"] > 0

    for got, ref in zip(logprobs + logprobs2, ref_logprobs + ref_logprobs):
        assert len(got) == len(ref)
        assert max(abs(a - b) for a, b in zip(got, ref)) < LOGPROB_TOLERANCE


def test_bad_payload_rejected_engine_keeps_serving(das_llm, reference):
    from das_trl.vllm.client import DASEngineError, LocalDASEngine
    from das_trl.vllm.payload import encode_rollouts

    engine = LocalDASEngine(das_llm)
    engine.attach()
    before = engine.stats()["history_tokens"]
    with pytest.raises(DASEngineError, match="not valid base64|magic"):
        engine._das_call("das_add_history", "this is not a payload")
    good = encode_rollouts([[1, 2, 3]], [[4, 5, 6]])
    truncated = good[: len(good) // 2]
    with pytest.raises(DASEngineError, match="rejected history payload"):
        engine._das_call("das_add_history", truncated)
    with pytest.raises(DASEngineError, match="outside the vocabulary"):
        engine.add_history([[1, 2]], [[10**9]])
    assert engine.stats()["history_tokens"] == before
    prompts, ref_tokens, _ = reference
    tokens, _ = _generate(das_llm, prompts[:2])
    assert tokens == ref_tokens[:2]


def test_controller_budgets_reach_vllm(das_llm, reference):
    """The budget controller's cut drafts are what vLLM verifies: with expensive verification and lengths it trusts,
    it keeps far fewer draft tokens than the drafter offers, and vLLM's own counters see the kept ones only."""
    from das_trl.vllm.client import LocalDASEngine
    from das_trl.vllm.metrics import spec_decode_counters

    prompts, ref_tokens, _ = reference
    engine = LocalDASEngine(das_llm)
    # step_token_cap: the cut must drop well over one draft per request (the slack below), whatever the history
    # left by the module's earlier tests makes the drafter offer (without it the margin was 40-65 tokens in some runs)
    engine.attach({"budget_controller": {"cost_source": "config", "c_tok_ms": 0.5, "tail_prior_weight": 0.0,
                                         "pooled_weight": 0.0, "step_token_cap": 12}})
    engine.reset("all")
    assert "budget_kept_tokens" in engine.add_history(prompts, ref_tokens)["stats"]
    before, counters_before = engine.stats(), spec_decode_counters(das_llm)
    tokens, _ = _generate(das_llm, prompts)
    after, counters = engine.stats(), spec_decode_counters(das_llm)
    assert tokens == ref_tokens
    offered = after["budget_offered_tokens"] - before["budget_offered_tokens"]
    kept = after["budget_kept_tokens"] - before["budget_kept_tokens"]
    assert kept == after["draft_tokens"] - before["draft_tokens"]  # the proposer returned the cut drafts
    verified = counters["num_draft_tokens"] - counters_before["num_draft_tokens"]
    # Drafts proposed in a request's last step are never scheduled: at most one draft (<= K tokens, and shorter than
    # the output) per request.
    slack = min(K, MAX_TOKENS) * NUM_PROMPTS
    assert kept - slack <= verified <= kept, (offered, kept, verified)
    assert offered - kept > slack, (offered, kept)  # so had the cut not reached vLLM, this would fail
    assert verified > 0 and counters["num_accepted_tokens"] > counters_before["num_accepted_tokens"]


def test_steps_never_offer_more_than_max_num_batched_tokens(model_path, reference):
    """An engine whose scheduler takes 32 tokens a step (16 rows): the proposer reads the budget from vLLM's config,
    and no step offers more (rows + draft tokens), although a converged history makes the drafter offer far longer
    drafts; the outputs stay the reference's."""
    from das_trl.vllm.client import LocalDASEngine

    budget = 32
    prompts, ref_tokens, _ = reference
    llm = make_llm(model_path, das=True, num_speculative_tokens=K, max_num_batched_tokens=budget,
                   max_num_seqs=NUM_PROMPTS, enable_chunked_prefill=True)
    try:
        engine = LocalDASEngine(llm)
        engine.attach()
        engine.add_history(prompts, ref_tokens)
        tokens, _ = _generate(llm, prompts)
        stats = engine.stats()
    finally:
        shutdown(llm)
    assert tokens == ref_tokens
    assert stats["max_num_batched_tokens"] == budget
    assert stats["draft_tokens"] > 0 and stats["capped_steps"] > 0  # the cap bound: the drafts were longer
    assert 0 < stats["peak_step_tokens"] <= budget
