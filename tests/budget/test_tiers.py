"""LengthPolicy: tiers from histories, promotion, drain growth, step cap, unseen prior, cost-mode optimum."""

import numpy as np
import pytest

from das_trl.budget.tiers import (LONG, MEDIUM, SHORT, LengthPolicy, LengthPolicyConfig, cost_condition_rhs,
                                    cost_optimal_drafts, cost_optimal_passes)


def _policy(**kw):
    p = LengthPolicy(LengthPolicyConfig(**kw))
    # 10 problems with lengths 100..1010 (score = (mean + max)/2 = 100 * (i + 1) + 7.5)
    for i in range(10):
        p.observe(f"p{i}", [100 * (i + 1), 100 * (i + 1) + 10])
    return p


def test_tiers_from_histories():
    p = _policy()
    tiers = [p.tier(f"p{i}") for i in range(10)]
    assert tiers == [SHORT] * 4 + [MEDIUM] * 4 + [LONG] * 2
    st = p.stats()
    assert st["tiers"] == {"short": 4, "medium": 4, "long": 2}
    assert st["threshold_long"] == pytest.approx(907.5)
    assert st["threshold_medium"] == pytest.approx(507.5)
    b = p.budgets([(f"p{i}", 0) for i in range(10)], num_running=10)
    assert b == [2] * 4 + [8] * 4 + [16] * 2


def test_score_uses_mean_and_max():
    p = LengthPolicy(LengthPolicyConfig(long_fraction=0.5, medium_fraction=0.0))
    p.observe("steady", [300, 300, 300, 300])   # score 300
    p.observe("spiky", [50, 50, 50, 700])       # mean 212.5, max 700 -> 456
    assert p.tier("spiky") == LONG and p.tier("steady") == SHORT


def test_promotion_by_running_length():
    p = _policy()
    assert p.tier("p0", 0) == SHORT
    assert p.tier("p0", 508) == MEDIUM    # passed the medium threshold (507.5)
    assert p.tier("p0", 908) == LONG      # passed the long threshold (907.5)
    assert p.tier("p5", 400) == MEDIUM    # never demoted
    b = p.budgets([("p0", 0), ("p0", 600), ("p0", 1000)], num_running=3)
    assert b[0] < b[1] < b[2]


def test_drain_growth():
    p = _policy()
    full = p.budgets([("p5", 0)] * 64, num_running=64)[0]
    assert full == 8
    mid = p.budgets([("p5", 0)] * 16, num_running=16)[0]
    assert mid == 16  # (64 / 16) ** 0.5 = 2
    few = p.budgets([("p5", 0)], num_running=1)[0]
    assert few == 32  # growth capped at 4, budget capped at max_budget 32
    p.new_step()
    assert p.budgets([("p5", 0)], num_running=1)[0] == 8  # new step: the peak is re-measured


def test_step_cap_respected():
    p = _policy(step_token_cap=100)
    req = [(f"p{i % 10}", 0) for i in range(50)]
    b = p.budgets(req, num_running=50)
    assert sum(b) <= 100
    uncapped = _policy(step_token_cap=0).budgets(req, num_running=50)
    assert sum(uncapped) > 100
    assert all(x <= y for x, y in zip(b, uncapped))
    assert max(b) > 0


def test_unseen_problem_gets_global_prior():
    p = _policy()
    assert p.tier("never-seen") == MEDIUM  # median score of the known problems is in the medium tier
    assert p.expected_length("never-seen") == pytest.approx(np.median([100 * (i + 1) + 7.5 for i in range(10)]))
    q = _policy(unseen_prior_quantile=1.0)
    assert q.tier("never-seen") == LONG
    empty = LengthPolicy()
    assert empty.tier("x") == MEDIUM and empty.budgets([("x", 0)], 1) == [8]


def test_fixed_mode():
    p = _policy(mode="fixed", fixed_budget=5)
    assert p.budgets([("p0", 0), ("p9", 0), ("zz", 999)], 3) == [5, 5, 5]


def test_cost_formula_satisfies_optimality_condition():
    rng = np.random.default_rng(1)
    l = rng.uniform(50, 2000, size=40)
    k = rng.uniform(0.6, 0.95, size=40)
    a = rng.uniform(0.3, 0.9, size=40)
    c_base, c_tok = 7.0, 0.025
    N = cost_optimal_passes(l, k, a, c_base, c_tok)
    assert np.max(l * (1 - k)) < N < np.max(l)
    assert cost_condition_rhs(l, k, a, N, c_tok) == pytest.approx(c_base, rel=1e-6)
    # p_i(N) makes request i finish in exactly N passes under the model N = l - k l (1 - exp(-a p / l))
    p = cost_optimal_drafts(l, k, a, N)
    m = l > N
    passes = l[m] - k[m] * l[m] * (1 - np.exp(-a[m] * p[m] / l[m]))
    np.testing.assert_allclose(passes, N, rtol=1e-9)
    assert np.all(p[~m] == 0)

    # N* minimises T(N) = c_base N + c_tok sum p_i(N) (numerically, on a grid around it)
    def T(n):
        return c_base * n + c_tok * cost_optimal_drafts(l, k, a, n).sum()
    grid = np.linspace(np.max(l * (1 - k)) + 1e-3, np.max(l), 4000)
    best = grid[np.argmin([T(g) for g in grid])]
    assert abs(best - N) <= (grid[1] - grid[0]) * 2
    assert T(N) <= min(T(g) for g in grid) + 1e-6


def test_cost_mode_budgets():
    p = _policy(mode="cost")
    b = p.budgets([("p0", 0), ("p9", 0), ("p9", 990)], num_running=3)
    assert b[1] >= b[0] and b[1] > 0       # the long problem gets at least as much
    # cheaper verification tokens -> more drafting
    cheap = _policy(mode="cost", c_tok_ms=0.001).budgets([("p0", 0), ("p9", 0)], 2)
    assert sum(cheap) >= sum(b[:2])
    p.record_acceptance(100, 10)
    assert p.acceptance_rate == pytest.approx(0.1)


def test_config_validation():
    with pytest.raises(ValueError):
        LengthPolicyConfig(mode="magic")
    with pytest.raises(ValueError):
        LengthPolicyConfig(long_fraction=0.7, medium_fraction=0.5)
    with pytest.raises(ValueError):
        LengthPolicyConfig(short_budget=-1)
