"""The gate's price per drafted row: configured by default (runs reproducible), measured from the proposer's own step
times when the user opts in (``draft_row_source="measured"``, :class:`ProposerCostFit`)."""

import math

import numpy as np
import pytest

from das_trl.budget import BudgetController, ControllerConfig
from das_trl.budget.proposer_cost import ProposerCostFit
from das_trl.drafter import native


def _feed(target, steps: int, seed: int = 0, a: float = 30.0, b: float = 0.4, c: float = 9.0, noise: float = 2.0):
    """``steps`` engine steps of ``a + b rows + c drafted`` microseconds (plus noise) into ``target``."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = int(rng.integers(8, 300))
        drafted = int(rng.integers(0, min(rows, 40) + 1))
        us = a + b * rows + c * drafted + rng.normal(0.0, noise)
        target(rows, drafted, us / 1e6)


def test_fit_recovers_the_cost_per_drafted_row():
    fit = ProposerCostFit(window=256, min_steps=16, refit_every=1)
    assert fit.estimate_us() is None
    _feed(fit.add, 10)
    assert fit.estimate_us() is None  # fewer than min_steps steps that drafted
    _feed(fit.add, 300, seed=1)
    a, b, c = fit.fit()
    assert a == pytest.approx(30.0, abs=3.0) and b == pytest.approx(0.4, abs=0.05)
    assert fit.estimate_us() == pytest.approx(9.0, abs=0.3)
    # the window keeps the recent steps: the proposer got 4x cheaper per drafted row
    _feed(fit.add, 256, seed=2, c=2.25)
    assert fit.estimate_us() == pytest.approx(2.25, abs=0.3)


def test_fit_needs_drafted_rows_that_vary_and_ignores_bad_times():
    fit = ProposerCostFit(min_steps=4, refit_every=1)
    for _ in range(50):
        fit.add(100, 5, 1e-4)  # every step drafts 5 rows: the per-row cost cannot be told from the per-step one
    assert fit.estimate_us() is None and math.isnan(fit.stats()["c_us"])
    fit.add(100, 6, math.nan)
    fit.add(100, 6, -1.0)
    assert fit.stats()["steps"] == 50
    with pytest.raises(ValueError, match="window"):
        ProposerCostFit(window=8)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_configured_price_decides_unless_the_user_opts_in(backend):
    """The same plan inputs: with the configured price (default), what the proposer measured changes nothing; with
    draft_row_source="measured", a proposer measured at 400 us per drafted row drafts fewer rows than the
    configured 20 us (and no row the configured price would not draft), and its stats say which price is used."""
    if backend == "native" and not native.available():
        pytest.skip("the native core is not built")
    n = 40
    args = (np.zeros(n, np.int64), np.full(n, 100), np.full(n, 60), np.full(n, 400), np.full(n, 16, np.int32),
            np.linspace(0.3, 0.95, n), np.arange(n))
    plans = {}
    for source in ("config", "measured"):
        ctl = BudgetController(ControllerConfig(backend=backend, draft_row_us=20.0, c_tok_ms=0.1,
                                                draft_row_source=source))
        ctl.observe(0, [300] * 8)
        before = ctl.plan(*args).draft.copy()
        _feed(ctl.observe_proposer, 200, c=400.0)
        plans[source] = (before, ctl.plan(*args).draft.copy(), ctl.stats())
    before, after, stats = plans["config"]
    assert (before == after).all() and stats["draft_row_us"] == 20.0
    assert stats["fit_draft_row_us"] == pytest.approx(400.0, rel=0.05)  # measured either way, used only when asked
    before_m, after_m, stats_m = plans["measured"]
    assert (before_m == before).all()  # the configured price until the fit answers
    assert stats_m["draft_row_us"] == pytest.approx(400.0, rel=0.05)
    assert after_m.sum() < before.sum() and not (after_m & ~before).any()
    with pytest.raises(ValueError, match="draft_row_source"):
        ControllerConfig(draft_row_source="host")
