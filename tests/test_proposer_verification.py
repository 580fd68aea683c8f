"""The live proposer's per-round bookkeeping: re-attaching retires tracked requests, verification outcomes reach the
drafter's calibrator, scheduler-trimmed drafts are not counted as rejected, and the removed length policy is refused.
Fast: real DASWorkerExtension + DASProposer + drafter behind a fake model runner (``reliability_fakes``)."""

import json

import numpy as np
import pytest

from reliability_fakes import K, FakeWorker, push_long_and_short_history, run_round


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _setup(rng):
    worker = FakeWorker()
    assert worker.das_attach("")["ok"]
    prompts, texts = push_long_and_short_history(worker, rng)
    return worker, prompts, texts


_round = run_round


def test_length_policy_is_refused_with_the_replacement_named(rng):
    """The earlier tier policy is gone from the engine: das_attach refuses it, names das_budget_controller, and
    changes nothing."""
    worker, prompts, texts = _setup(rng)
    before = worker.proposer.controller
    reply = worker.das_attach(json.dumps({"length_policy": {"mode": "tiers"}}))
    assert not reply["ok"] and "das_budget_controller" in reply["error"] and "das+policy" in reply["error"]
    assert worker.proposer.controller is before


def test_reattach_retires_tracked_requests_and_running_ones_resume(rng):
    worker, prompts, texts = _setup(rng)
    rows = [("a", 1, 5), ("b", 2, 5)]
    _round(worker, prompts, texts, rows)
    assert worker.proposer.stats()["active_requests"] == 2
    assert worker.das_attach("")["ok"]  # e.g. a client re-attaching between two generations
    assert worker.proposer.stats()["active_requests"] == 0  # none orphaned in the drafter
    # A request still running after the re-attach is picked up again, with its whole output so far.
    drafts = _round(worker, prompts, texts, [("a", 1, 9)])
    assert worker.proposer.stats()["active_requests"] == 1
    assert drafts[0] == texts[1][9:9 + len(drafts[0])] and drafts[0]


def test_verification_outcomes_reach_the_drafters_calibrator(rng):
    """The proposer reports how many of each request's draft tokens were accepted (sampled tokens - 1) to the
    drafter, which learns its acceptance calibration from them."""
    worker, prompts, texts = _setup(rng)
    drafter = worker.proposer.drafter
    first = _round(worker, prompts, texts, [("a", 0, 5)])[0]  # first sight: started, extended, drafted
    draft = _round(worker, prompts, texts, [("a", 0, 6)])[0]  # one sampled token: the first draft got 0 accepted
    assert len(first) == len(draft) == K
    # Verification accepted 3 of the K draft tokens: the row gets those 3 plus one sampled token.
    runner = worker.model_runner
    runner.set_rows([("a", prompts[0], texts[0][:10])])
    runner.step([texts[0][6:10]])
    s = drafter.stats()
    assert s["verified_drafts"] == 2 and s["accepted_tokens"] == 0 + 3
    assert s["calibration_tokens"] == 2 * K


def test_draft_tokens_trimmed_by_the_scheduler_are_not_counted_as_rejected(rng):
    """vLLM's scheduler may verify only part of a draft (token budget); the model runner's per-row
    ``num_decode_draft_tokens`` says how much, and only those tokens reach the calibration."""
    from types import SimpleNamespace

    worker, prompts, texts = _setup(rng)
    drafter = worker.proposer.drafter
    first = _round(worker, prompts, texts, [("a", 0, 5)])[0]
    assert len(first) == K
    worker.model_runner.num_decode_draft_tokens = SimpleNamespace(np=np.array([3] + [-1] * 7, dtype=np.int32))
    _round(worker, prompts, texts, [("a", 0, 6)])  # one sampled token: 0 of the 3 verified tokens accepted
    assert drafter.stats()["calibration_tokens"] == 3
    assert worker.proposer.stats()["accepted_tokens"] == 0


def test_history_bytes_count_the_native_automata(rng):
    """``history_bytes`` (logged as das/history_bytes) is what the history costs the engine: the token storage plus
    the native core's automata, not the token storage alone (4 B per token)."""
    worker, _, _ = _setup(rng)
    d = worker.proposer.drafter.stats()
    stats = worker.proposer.stats()
    assert d["backend"] == "native" and d["index_bytes"] + d["global_bytes"] > 0
    assert stats["history_bytes"] == d["approx_bytes"] + d["index_bytes"] + d["global_bytes"]
    assert stats["history_bytes"] > 4 * stats["history_tokens"]
