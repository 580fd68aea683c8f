"""Drafts never hold back a request waiting for admission or prefill (``das_trl/vllm/scheduler.py``), on the real CPU
engine with the packaged model: ``max_num_batched_tokens`` 128 with chunked prefill, 24 rows whose completions are in
the drafter's history (greedy, drafting), then (a) a burst of 24 short prompts and (b) 4 prompts of 300 tokens. Every
arriving request gets its first token within 1.25x the engine steps of the engine without speculation, at K 8 and at
the default K; greedy outputs are identical; the draft tokens the scheduler cut are not counted as verified.
The scenario is ``scripts/bench_admission.py``'s (which prints the figures, and vLLM's scheduler's for comparison),
sized down: short row and burst prompts, few tokens per row.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from das_trl.vllm.engine import DEFAULT_NUM_SPECULATIVE_TOKENS

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
ROW_TOKENS = 96  # prompt + completion per drafting row: long enough to be drafting through both cases
TARGET_RATIO = 1.25


def _scenario():
    spec = importlib.util.spec_from_file_location("bench_admission", ROOT / "scripts" / "bench_admission.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plain(model_path):
    """The prompts, the rows' greedy completions and steps to first token on the engine without speculation."""
    from das_trl.bench.live.engine import shutdown_engine

    scenario = _scenario()
    prompts = scenario.scenario_prompts(model_path, short=True)
    llm = scenario.make_engine(model_path)
    try:
        completions = scenario.reference_rows(llm, prompts["rows"], ROW_TOKENS)
        results = {case: scenario.steps_to_first_token(llm, prompts["rows"], completions, prompts[case], warm=2)
                   for case in ("burst", "late")}
    finally:
        shutdown_engine(llm)
    return scenario, model_path, prompts, completions, results


@pytest.mark.parametrize("k", [8, DEFAULT_NUM_SPECULATIVE_TOKENS])
def test_arrivals_get_first_tokens_as_soon_as_without_speculation(plain, k):
    scenario, model_path, prompts, completions, base = plain
    das = scenario.run_engine(model_path, k, "das", prompts, completions, warm=2)
    for case in ("burst", "late"):
        steps, reference = das[case]["steps"], base[case]["steps"]
        assert all(s <= TARGET_RATIO * b for s, b in zip(steps, reference)), (case, steps, reference)
        assert das[case]["arrival_outputs"] == base[case]["arrival_outputs"]  # greedy: token-identical
        assert das[case]["rows_match"]
    proposer, vllm_counts = das["proposer"], das["spec_decode"]
    # The rows drafted, the scheduler cut drafts for the arrivals, and only the draft tokens vLLM verified reached the
    # drafter's calibration (cut tokens are neither accepted nor rejected).
    assert vllm_counts["num_accepted_tokens"] > 0 and das["cut_draft_tokens"] > 0
    assert proposer["calibration_tokens"] <= vllm_counts["num_draft_tokens"]
    assert proposer["accepted_tokens"] <= vllm_counts["num_accepted_tokens"]
