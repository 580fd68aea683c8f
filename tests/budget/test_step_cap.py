"""The step's draft tokens capped by the engine's token budget (vLLM's max_num_batched_tokens)."""

import numpy as np
import pytest

from das_trl.budget.step_cap import cap_step_tokens


def test_fits_unchanged():
    out = cap_step_tokens(np.array([3, 0, 5]), 8)
    assert out.tolist() == [3, 0, 5] and out.dtype == np.int32


def test_far_positions_go_first():
    # total 4 + 30 + 12 = 46 > 20: a common length 8 gives 4 + 8 + 8 = 20
    assert cap_step_tokens(np.array([4, 30, 12]), 20).tolist() == [4, 8, 8]
    # 21: one more token to the first row still longer than the common length
    assert cap_step_tokens(np.array([4, 30, 12]), 21).tolist() == [4, 9, 8]
    assert cap_step_tokens(np.array([4, 30, 12]), 0).tolist() == [0, 0, 0]
    assert cap_step_tokens(np.array([4, 30, 12]), -5).tolist() == [0, 0, 0]


@pytest.mark.parametrize("seed", range(20))
def test_random_caps_hold(seed):
    rng = np.random.default_rng(seed)
    kept = rng.integers(0, 65, int(rng.integers(1, 300)))
    budget = int(rng.integers(0, kept.sum() + 10))
    out = cap_step_tokens(kept, budget)
    assert (out >= 0).all() and (out <= kept).all()
    assert out.sum() == min(budget, kept.sum())  # the budget is used in full when it binds
    # no row is cut below another that keeps more than one token more (far positions first)
    cut = out < kept
    if cut.any():
        assert out.max() <= out[cut].min() + 1
