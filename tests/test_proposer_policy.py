"""With a length_policy sent with das_attach (the budget source before the controller), the live proposer's draft
budgets come from the LengthPolicy (the same object the replay benchmark uses): a request of a short problem gets the
short tier's budget, a long problem's request the long tier's, and per-tier rounds/tokens are counted. Fast: real DASWorkerExtension + DASProposer +
DASDrafter behind a fake model runner (``reliability_fakes``)."""

import json

import numpy as np
import pytest

from reliability_fakes import K, FakeWorker, push_long_and_short_history, run_round
from das_trl.drafter import problem_key


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _setup(rng):
    worker = FakeWorker()
    assert worker.das_attach("")["ok"]
    prompts, texts = push_long_and_short_history(worker, rng)
    return worker, prompts, texts


_round = run_round


def test_budgets_follow_the_problems_length_tier(rng):
    worker, prompts, texts = _setup(rng)
    assert worker.proposer.stats()["budget_source"] == "controller"  # the default
    assert worker.das_attach(json.dumps({"length_policy": {"mode": "tiers"}}))["ok"]
    assert worker.proposer.stats()["policy_mode"] == "tiers"
    rows = [("long", 0, 5), ("short", 3, 5)]
    _round(worker, prompts, texts, rows)  # first sight: requests start
    drafts = _round(worker, prompts, texts, [(r, i, n + 1) for r, i, n in rows])
    assert drafts[0] == texts[0][6:6 + K]  # long tier: 16 capped at K = 8
    assert 0 < len(drafts[1]) <= 2 and drafts[1] == texts[3][6:6 + len(drafts[1])]  # short tier: 2
    s = worker.proposer.stats()
    assert s["budget_tier_long_rounds"] == 2 and s["budget_tier_short_rounds"] == 2
    assert s["budget_tier_long_tokens"] == 2 and s["budget_tier_short_tokens"] == 2  # one sampled token per row a round
    assert "budget_tier_long_rounds" in s["budget_counters"]


def test_length_policy_from_das_attach_replaces_the_policy(rng):
    worker, prompts, texts = _setup(rng)
    reply = worker.das_attach(json.dumps({"length_policy": {"mode": "fixed", "fixed_budget": K}}))
    assert reply["ok"], reply
    assert worker.proposer.policy.config.mode == "fixed"
    rows = [("a", 3, 5), ("b", 4, 5)]
    _round(worker, prompts, texts, rows)
    drafts = _round(worker, prompts, texts, [(r, i, n + 1) for r, i, n in rows])
    assert [len(d) for d in drafts] == [K, K]
    bad = worker.das_attach(json.dumps({"length_policy": {"mode": "sometimes"}}))
    assert not bad["ok"] and "mode" in bad["error"]
    assert worker.proposer.policy.config.mode == "fixed"  # a rejected config changes nothing


def test_policy_tiers_are_rebuilt_from_history_on_reconfigure(rng):
    worker, prompts, texts = _setup(rng)
    assert worker.das_attach(json.dumps({"length_policy": {"short_budget": 1}}))["ok"]
    policy = worker.proposer.policy
    assert policy.stats()["problems"] == 5  # lengths replayed from the history, not lost with the old policy
    assert policy.expected_length(problem_key(prompts[0])) == 200.0
    assert policy.tier(problem_key(prompts[0])) == 2 and policy.tier(problem_key(prompts[1])) < 2


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
