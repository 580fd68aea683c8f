"""The budget controller's native kernel against the numpy reference (``ControllerConfig.backend``): same random draws,
same budgets and diagnostics up to floating-point rounding, on random batches (unknown problems, max_tokens caps, zero
acceptance tails, cheap and expensive verification); clear errors on bad shapes."""

import numpy as np
import pytest

from das_trl.drafter import native
from das_trl.budget.controller import BudgetController, ControllerConfig



def _pair(seed: int, **cfg):
    base = dict(cost_source="config", seed=seed, **cfg)
    return (BudgetController(ControllerConfig(**base, backend="python")),
            BudgetController(ControllerConfig(**base, backend="native")))


@pytest.mark.parametrize("c_tok", [0.005, 0.025, 0.1, 0.5])
def test_native_budgets_equal_the_numpy_reference(c_tok):
    rng = np.random.default_rng(int(c_tok * 1000))
    rows = same = 0
    for trial in range(12):
        ref, nat = _pair(trial, c_tok_ms=c_tok, tail_prior_weight=float(rng.choice([0.0, 0.25, 1.0])))
        problems = int(rng.integers(1, 30))
        for key in range(problems):
            lengths = rng.integers(5, 3000, int(rng.integers(1, 20))).tolist()
            ref.observe(key, lengths)
            nat.observe(key, lengths)
        for step in range(3):
            n, k = int(rng.integers(1, 200)), 16
            keys = rng.integers(0, problems + 3, n)  # some problems without history
            out_len = rng.integers(0, 2500, n)
            rounds = out_len // int(rng.integers(1, 4))
            acc = np.sort(rng.random((n, k)), axis=1)[:, ::-1].copy()
            acc[rng.random((n, k)) < 0.1] = 0.0
            acc = np.minimum.accumulate(acc, axis=1)
            max_out = None if trial % 2 else np.full(n, 2048)
            got_ref = ref.budgets(acc, keys, out_len, rounds, max_out)
            got_nat = nat.budgets(acc, keys, out_len, rounds, max_out)
            assert got_nat.dtype == np.int32 and got_nat.shape == (n,)
            rows += n
            same += int((got_ref == got_nat).sum())
            np.testing.assert_allclose(nat.last_tail_prob, ref.last_tail_prob, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(nat.last_expected_remaining, ref.last_expected_remaining, rtol=1e-12)
            assert nat.last_expected_makespan == pytest.approx(ref.last_expected_makespan, rel=1e-12)
            agree = got_ref == got_nat
            np.testing.assert_allclose(nat.last_expected_kept[agree], ref.last_expected_kept[agree], rtol=1e-9,
                                       atol=1e-12)
    # Only a near-tie in the argmin may go the other way (rounding of exp/log); none did in development.
    assert same >= 0.995 * rows, (same, rows)
    assert ref.stats()["kept_tokens"] == pytest.approx(nat.stats()["kept_tokens"], rel=0.01)


def test_auto_backend_uses_the_kernel_and_step_cap_uses_numpy():
    assert BudgetController(ControllerConfig())._native_kernel() is native.load().controller_budgets
    assert BudgetController(ControllerConfig(backend="python"))._native_kernel() is None
    capped = BudgetController(ControllerConfig(cost_source="config", step_token_cap=4))
    assert capped._native_kernel() is None  # the kernel has no step cap: numpy applies it
    got = capped.budgets(np.full((3, 8), 0.9), np.zeros(3, np.int64), np.zeros(3, np.int64))
    assert got.sum() <= 4


def test_bad_backend_and_bad_kernel_shapes_raise_clearly():
    with pytest.raises(ValueError, match="backend"):
        ControllerConfig(backend="gpu")
    kernel = native.load().controller_budgets
    n = 3
    out = [np.empty(n, np.int32)] + [np.empty(n) for _ in range(4)]
    with pytest.raises(ValueError, match="generated must have 3 rows"):
        kernel(np.zeros((n, 4)), np.zeros((n, 2)), np.zeros(0), np.zeros(2), np.full(n, np.inf), np.ones(n),
               np.zeros((4, n, 8)), {}, *out)
    with pytest.raises(ValueError, match=r"draws must be \[4, n, samples\]"):
        kernel(np.zeros((n, 4)), np.zeros((n, 2)), np.zeros(0), np.zeros(n), np.full(n, np.inf), np.ones(n),
               np.zeros((3, n, 8)), {}, *out)
