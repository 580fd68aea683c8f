"""The batch budget controller (das_trl/budget/controller.py and the pure functions beside it): their algebra against
brute force, and what it decides: absolute length awareness (a long-history problem drafts long even when it is the
only problem, which the old ``tiers`` ranking gets wrong), nothing drafted when verification is expensive and
acceptance low, the most drafted for the longest request when verification is cheap and the batch drains."""

import math

import numpy as np
import pytest

from das_trl.budget import BudgetController, ControllerConfig
from das_trl.budget.draft_lengths import optimal_draft_lengths
from das_trl.budget.remaining import remaining_samples
from das_trl.budget.step_cap import apply_step_cap
from das_trl.budget.tail import survival, tail_probability
from das_trl.budget.cost_model import ASSUMED_C_LOGPROB_MS, CostModel, OnlineCostFit, fit_linear
from das_trl.budget.length_table import PAD, LengthTable
from das_trl.budget.tiers import LengthPolicy, LengthPolicyConfig

K = 16


def _accept(rows: int, first: float, decay: float, k: int = K) -> np.ndarray:
    """``float64 [rows, k]``: cumulative acceptance first * decay**j (non-increasing)."""
    return np.tile(first * decay ** np.arange(k), (rows, 1))


# ---------------------------------------------------------------------------- the behaviour
def _budgets_for(source: str, history: list[int], n: int, generated: int, accept: np.ndarray) -> np.ndarray:
    """Budgets of ``n`` running siblings of the only problem, under the controller or the old tiers policy."""
    key = 12345
    if source == "controller":
        ctl = BudgetController(ControllerConfig(cost_source="config"))
        ctl.observe(key, history)
        return ctl.budgets(accept, np.full(n, key), np.full(n, generated), np.full(n, generated // 4))
    policy = LengthPolicy(LengthPolicyConfig(mode="tiers", max_budget=K))
    policy.observe(key, history)
    return np.minimum(policy.budgets([(key, generated)] * n, n), (accept > 0).sum(axis=1))


@pytest.mark.parametrize("source", ["controller",
                                    pytest.param("tiers", marks=pytest.mark.xfail(strict=True, reason=(
                                        "tiers ranks problems against each other: the only problem is 'short'")))])
def test_only_problem_with_long_history_gets_a_long_budget(source):
    # One problem whose recent completions all ran ~2000 tokens; 8 siblings are 100 tokens in, drafts of 16 tokens
    # with good acceptance. Verification is worth it: they will run ~1900 more tokens and any may be the last.
    budgets = _budgets_for(source, [1900, 1950, 2000, 2050, 2100, 1980, 2020, 2000], 8, 100, _accept(8, 0.95, 0.97))
    assert (budgets >= 12).all(), budgets


def test_absolute_length_matters_a_request_about_to_end_does_not_draft_past_it():
    # Same problem and drafts, but its completions end at ~104 tokens: 4 tokens to go, so the positions after them
    # are verified for nothing.
    budgets = _budgets_for("controller", [103, 104, 105, 104, 104, 103, 105, 104], 8, 100, _accept(8, 0.95, 0.97))
    assert (budgets <= 6).all(), budgets
    long = _budgets_for("controller", [1900, 1950, 2000, 2050, 2100, 1980, 2020, 2000], 8, 100,
                        _accept(8, 0.95, 0.97))
    assert long.min() > budgets.max()


def test_expensive_verification_and_low_acceptance_draft_nothing():
    ctl = BudgetController(ControllerConfig(c_base_ms=1.0, c_tok_ms=1.0, cost_source="config"))
    for key in range(8):
        ctl.observe(key, [200 + 50 * key] * 8)
    n = 64
    keys = np.arange(n) % 8
    budgets = ctl.budgets(_accept(n, 0.2, 0.8), keys, np.full(n, 50), np.full(n, 40))
    assert budgets.dtype == np.int32 and budgets.shape == (n,)
    assert (budgets == 0).all(), budgets
    # The same batch with the paper's cheap verification and good acceptance drafts: it is the cost that decided.
    cheap = BudgetController(ControllerConfig(cost_source="config"))
    for key in range(8):
        cheap.observe(key, [200 + 50 * key] * 8)
    assert cheap.budgets(_accept(n, 0.9, 0.95), keys, np.full(n, 50), np.full(n, 40)).sum() > 0


def test_cheap_verification_and_draining_batch_draft_most_for_the_longest():
    # verification at 0.005 ms per token in all (no logprob row charged on top)
    ctl = BudgetController(ControllerConfig(c_tok_ms=0.005, c_logprob_ms=0.0, cost_source="config"))
    lengths = {1: [1000, 1100, 950, 1050], 2: [300, 320, 310, 290], 3: [200, 210, 190, 205]}
    for key, ls in lengths.items():
        ctl.observe(key, ls)
    # Three requests left (the batch has drained), 150 tokens in, identical draft quality.
    budgets = ctl.budgets(_accept(3, 0.9, 0.7), np.array([1, 2, 3]), np.full(3, 150), np.full(3, 60))
    assert budgets[0] == K, budgets  # the one that will finish last drafts everything it has
    assert budgets[0] > budgets[2] and budgets[0] >= budgets[1], budgets
    assert ctl.last_tail_prob.argmax() == 0 and ctl.last_expected_remaining.argmax() == 0


def test_step_token_cap_and_hard_cap():
    ctl = BudgetController(ControllerConfig(cost_source="config", step_token_cap=20, tail_prior_weight=1.0))
    acc = _accept(4, 0.99, 0.99)
    acc[1, 5:] = 0.0  # row 1's draft has 5 tokens only: its hard cap
    budgets = ctl.budgets(acc, np.zeros(4, np.int64), np.zeros(4), None, None)
    assert budgets.sum() <= 20 and budgets[1] <= 5
    assert ctl.stats()["capped_steps"] == 1


def test_input_validation():
    ctl = BudgetController(ControllerConfig(cost_source="config"))
    with pytest.raises(ValueError, match=r"accept must be \[n, K\]"):
        ctl.budgets(np.zeros(4), np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="output_len must have shape"):
        ctl.budgets(np.zeros((4, K)), np.zeros(4), np.zeros(3))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ctl.budgets(np.full((2, K), 1.5), np.zeros(2), np.zeros(2))
    assert ctl.budgets(np.zeros((0, K)), np.zeros(0), np.zeros(0)).shape == (0,)
    with pytest.raises(ValueError, match="cost_source"):
        ControllerConfig(cost_source="guess")
    with pytest.raises(ValueError, match="c_tok_ms"):
        ControllerConfig(c_tok_ms=0.0)
    for name in ("tau_uncertainty", "gate_send_rounds", "draft_row_us"):
        for bad in (-1.0, float("nan"), float("inf"), True, "x"):
            with pytest.raises(ValueError, match=name):
                ControllerConfig(**{name: bad})
    assert ControllerConfig(c_base_ms=7, tau_uncertainty=0, gate_send_rounds=np.float64(2.0)).c_base_ms == 7


# ---------------------------------------------------------------------------- pure algebra
def test_optimal_lengths_minimise_the_cost_per_token_and_meet_the_first_order_rule():
    rng = np.random.default_rng(0)
    n = 200
    acc = np.sort(rng.random((n, K)), axis=1)[:, ::-1]  # non-increasing rows
    acc[rng.random(n) < 0.2, 8:] = 0.0
    weight = rng.exponential(1.0, n) * rng.choice([0.0, 0.01, 1.0, 7.0], n)
    c_tok = 0.025
    d, value = optimal_draft_lengths(acc, weight, c_tok)
    for i in range(n):
        tau = 1.0 + np.concatenate([[0.0], np.cumsum(acc[i])])
        ratio = (weight[i] + c_tok * (1 + np.arange(K + 1))) / tau
        assert math.isclose(ratio[d[i]], ratio.min(), rel_tol=1e-12)
        assert math.isclose(value[i], ratio[d[i]], rel_tol=1e-12)
        # First-order rule: the last kept position pays, the next one does not.
        if d[i] > 0:
            assert acc[i, d[i] - 1] * value[i] >= c_tok * (1 - 1e-9)
        if d[i] < K:
            assert acc[i, d[i]] * value[i] <= c_tok * (1 + 1e-9)
    assert (d[weight == 0.0] == 0).all()  # nobody waits on it: drafting cannot pay


def test_tail_probability_matches_the_maximum_frequency_and_splits_ties():
    rng = np.random.default_rng(0)
    rounds = rng.exponential(1.0, (5, 20000)) * np.arange(1, 6)[:, None] * 10.0
    p, makespan = tail_probability(rounds)
    counted = np.bincount(rounds.argmax(axis=0), minlength=5) / rounds.shape[1]
    assert np.abs(p - counted).max() < 0.01 and p.sum() == pytest.approx(1.0)
    assert makespan == pytest.approx(rounds.max(axis=0).mean())
    # Small probabilities are resolved, not rounded to 0 as sample counting would with 64 samples.
    # Row 1 runs long in one sample of 64, a sample in which row 0 ran longer still: never the maximum there.
    few = np.vstack([np.full(64, 100.0) + rng.normal(0, 1, 64), np.full(64, 50.0)])
    few[0, 7], few[1, 7] = 103.0, 101.5
    assert (few.argmax(axis=0) == 0).all()
    p_few, _ = tail_probability(few)
    assert 0.0 < p_few[1] < 0.05
    # Requests cut at the same max_tokens tie exactly: they share the tail.
    assert tail_probability(np.full((4, 64), 256.0))[0] == pytest.approx([0.25] * 4)
    assert tail_probability(np.ones((1, 8)))[0].tolist() == [1.0]


def test_remaining_samples_condition_on_progress_and_fall_back():
    table = LengthTable(max_lengths=8)
    table.observe(1, [100, 200, 300, 400])
    table.observe(2, [50, 60])
    t, counts, pooled = table.gather(np.array([1, 1, 2, 99, 1], np.int64))
    assert counts.tolist() == [4, 4, 2, 0, 4] and (t[3] == PAD).all()
    rng = np.random.default_rng(0)
    generated = np.array([0, 250, 100, 10, 1000])
    rem = remaining_samples(t, counts, pooled, generated, np.array([np.inf, np.inf, np.inf, np.inf, 200.0]), rng,
                            2000, pooled_weight=0.0, jitter=0.0, extrapolation_fraction=0.25, min_remaining=16)
    assert set(np.round(rem[0]).astype(int)) == {100, 200, 300, 400}
    assert set(np.round(rem[1]).astype(int)) == {50, 150}  # only lengths past 250 tokens
    # Problem 2 never ran past 100 tokens: the pooled lengths above 100 (its own samples are all shorter).
    assert rem[2].min() > 0 and np.quantile(rem[2], 0.5) > 50
    assert rem[3].mean() > 50  # unknown problem: all problems' lengths
    # Past every length seen anywhere: an exponential tail of mean 0.25 * 1000 tokens, capped at max_remaining.
    assert rem[4].max() <= 200 and 100 < np.mean(rem[4]) <= 200
    assert rem.min() >= 1.0


def test_a_history_push_sorts_the_length_table_so_the_next_plan_does_not(monkeypatch):
    """The table is rebuilt at the push (history_pushed), not by the first engine step after it; the plan reads the
    same table either way."""
    lazy, eager = BudgetController(ControllerConfig(cost_source="config")), \
        BudgetController(ControllerConfig(cost_source="config"))
    for ctl in (lazy, eager):
        ctl.observe(7, [100, 200, 300])
        ctl.observe(9, [1000, 1200])
    eager.history_pushed()
    rebuilds = []
    monkeypatch.setattr(LengthTable, "_rebuild", lambda self, real=LengthTable._rebuild: (rebuilds.append(self),
                                                                                          real(self)))
    keys, out_len = np.array([7, 9, 9]), np.array([50, 400, 900])
    b_eager = eager.budgets(_accept(3, 0.9, 0.95), keys, out_len, out_len // 4)
    assert rebuilds == []  # the push built it
    b_lazy = lazy.budgets(_accept(3, 0.9, 0.95), keys, out_len, out_len // 4)
    assert rebuilds == [lazy.lengths]  # without the push, the first plan builds it
    assert np.array_equal(b_eager, b_lazy)
    eager.history_pushed()  # nothing new observed: no rebuild
    assert rebuilds == [lazy.lengths]


def test_a_push_building_the_table_while_steps_gather_from_it():
    """A history push (observe + prepare on its thread) while engine steps gather: every gather reads one build whole
    (its keys, rows and counts agree), never keys of one build with rows of another."""
    import threading

    table = LengthTable(max_lengths=8)
    stop, errors = threading.Event(), []

    def push():
        key = 0
        while not stop.is_set():
            table.observe(key, [100 + key % 7, 200])
            table.prepare()
            key += 1

    pusher = threading.Thread(target=push)
    pusher.start()
    try:
        for _ in range(3000):
            keys = np.arange(0, 64, 3)
            try:
                rows, counts, _ = table.gather(keys)
                assert np.array_equal((rows > PAD).sum(axis=1), counts)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                break
    finally:
        stop.set()
        pusher.join()
    assert not errors, errors


def test_survival_is_the_share_of_samples_still_running():
    rem = np.array([[1.0, 2.5, 3.0, 10.0], [50.0, 50.0, 50.0, 50.0]])
    s = survival(rem, 4)
    # position j needs more than j + 1 tokens to go
    assert s[0].tolist() == [0.75, 0.5, 0.25, 0.25]
    assert s[1].tolist() == [1.0, 1.0, 1.0, 1.0]


def test_step_cap_drops_the_smallest_gains_and_keeps_prefixes():
    acc = np.array([[0.9, 0.8, 0.7, 0.1], [0.95, 0.95, 0.95, 0.95], [0.5, 0.0, 0.0, 0.0]])
    lengths = np.array([4, 4, 1])
    value = np.array([1.0, 1.0, 1.0])
    out = apply_step_cap(acc, lengths, value, 0.025, 6)
    assert out.tolist() == [2, 4, 0]
    assert apply_step_cap(acc, lengths, value, 0.025, 0).tolist() == [4, 4, 1]


# ---------------------------------------------------------------------------- cost model
def test_online_fit_recovers_the_cost_model_and_refuses_noise():
    rng = np.random.default_rng(1)
    fit = OnlineCostFit(window=128, min_steps=32, min_r2=0.5)
    for _ in range(31):
        t = int(rng.integers(16, 400))
        fit.add(t, 7.0 + 0.025 * t + rng.normal(0, 0.05))
    assert fit.estimate() is None  # too few steps
    fit.add(100, 9.5)
    fit.add(100, 1e6)  # an idle engine between two generations: dropped
    est = fit.estimate()
    assert est is not None and abs(est.c_base_ms - 7.0) < 0.1 and abs(est.c_tok_ms - 0.025) < 0.001
    assert fit.stats()["dropped"] == 1
    noisy = OnlineCostFit(window=128, min_steps=32, min_r2=0.5)
    for _ in range(64):
        noisy.add(int(rng.integers(16, 400)), float(rng.uniform(5, 50)))
    assert noisy.estimate() is None  # r2 too low to trust
    base, tok, r2 = fit_linear(np.array([1.0, 2.0, 3.0]), np.array([3.0, 5.0, 7.0]))
    assert (base, tok, r2) == pytest.approx((1.0, 2.0, 1.0))
    with pytest.raises(ValueError, match="c_base_ms"):
        CostModel(0.0, 0.1)


def test_controller_uses_the_online_fit_once_trusted():
    ctl = BudgetController(ControllerConfig(cost_source="online", fit_min_steps=8))
    assert ctl.cost == CostModel(7.0, 0.025, ASSUMED_C_LOGPROB_MS)
    for t in range(10, 200, 10):
        ctl.observe_step(t, 2.0 + 0.5 * t)
    assert ctl.cost.c_tok_ms == pytest.approx(0.5) and ctl.cost.c_base_ms == pytest.approx(2.0)
    assert ctl.cost.c_logprob_ms == 0.0  # patched: the fit's c_tok holds each verified position's logprob row
    assert ctl.stats()["cost_online"] == 1
    padded = BudgetController(ControllerConfig(cost_source="online", fit_min_steps=8, verification_shape="padded"))
    for t in range(10, 200, 10):
        padded.observe_step(t, 2.0 + 0.5 * t)
    assert padded.cost.c_tok_ms == pytest.approx(0.5) and padded.cost.padded  # the padding is not in proportion
    assert padded.cost.c_logprob_ms == ASSUMED_C_LOGPROB_MS                       # to the tokens: still charged
    fixed = BudgetController(ControllerConfig(cost_source="config", fit_min_steps=8))
    for t in range(10, 200, 10):
        fixed.observe_step(t, 2.0 + 0.5 * t)
    assert fixed.cost == CostModel(7.0, 0.025, ASSUMED_C_LOGPROB_MS) and fixed.stats()["cost_online"] == 0


def test_acceptance_record_corrects_the_estimates_it_selects_on_and_fades():
    def make():
        ctl = BudgetController(ControllerConfig(cost_source="config", c_tok_ms=0.1))
        for key in range(4):
            ctl.observe(key, [300] * 8)
        return ctl

    keys, gen, rounds = np.arange(4), np.full(4, 50), np.full(4, 40)
    acc = _accept(4, 0.7, 0.9)
    trusting = make().budgets(acc, keys, gen, rounds)
    burnt = make()
    for _ in range(50):
        burnt.observe_acceptance(4.0, 2)  # its kept drafts were accepted half as often as estimated
    assert burnt.acceptance_ratio == pytest.approx((100 + 32) / (200 + 32))
    assert burnt.budgets(acc, keys, gen, rounds).sum() < trusting.sum()
    # Bounded: a collapse (nothing accepted) cannot shut drafting off for good; and it fades without new evidence.
    for _ in range(1000):
        burnt.observe_acceptance(4.0, 0)
    assert burnt.acceptance_ratio == 0.5
    for _ in range(400):
        burnt.budgets(acc, keys, gen, rounds)
    assert burnt.acceptance_ratio > 0.9
