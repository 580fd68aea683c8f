"""The step's draft tokens capped by the engine's token budget (vLLM's max_num_batched_tokens), and its longest draft
by what vLLM's padded verification logprobs cost."""

import numpy as np
import pytest

from das_trl.budget.step_cap import cap_longest_draft, cap_step_tokens


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


def _brute_force_longest(useful, lengths, value, token_ms, c_logprob_ms, num_rows):
    """max over L of (kept positions' gains, none below 0) - c_logprob x (num_rows x L - kept positions): every L
    tried, the longest of equals kept."""
    best, best_len = -np.inf, 0
    for cap in range(int(lengths.max()) + 1):
        kept = np.minimum(lengths, cap)
        gains = sum(float(np.maximum(useful[i, :kept[i]] * value[i] - token_ms, 0).sum()) for i in range(len(lengths)))
        total = gains - c_logprob_ms * (num_rows * cap - int(kept.sum()))
        if total >= best - 1e-12:
            best, best_len = max(total, best), cap
    return np.minimum(lengths, best_len)


@pytest.mark.parametrize("seed", range(6))
def test_cap_longest_draft_maximises_the_step_s_net_gain(seed):
    rng = np.random.default_rng(seed)
    m, k = 5, 24
    useful = np.cumprod(rng.uniform(0.6, 0.99, (m, k)), axis=1)
    lengths = rng.integers(0, k + 1, m).astype(np.int32)
    value = rng.uniform(0.05, 7.0, m)
    for c_logprob, rows in ((0.001, 64), (0.001, 1024), (0.01, 512)):
        got = cap_longest_draft(useful, lengths, value, 0.026, c_logprob, rows)
        assert (got == _brute_force_longest(useful, lengths, value, 0.026, c_logprob, rows)).all()
        assert (got <= lengths).all()
        # the kept drafts' expected saving pays for their padding
        kept = np.arange(k)[None, :] < got[:, None]
        saving = float(np.where(kept, np.maximum(useful * value[:, None] - 0.026, 0.0), 0.0).sum())
        assert saving >= c_logprob * (rows * int(got.max(initial=0)) - int(got.sum())) - 1e-9


def test_cap_longest_draft_keeps_a_long_tail_draft_in_a_small_batch_and_cuts_it_in_a_large_one():
    useful = np.full((1, 40), 0.9) ** np.arange(1, 41)  # the batch's likely last row, 90 % per token
    lengths, value = np.array([40], np.int32), np.array([0.5])  # one token of its progress is worth 0.5 ms
    small = cap_longest_draft(useful, lengths, value, 0.026, 0.001, 8)
    large = cap_longest_draft(useful, lengths, value, 0.026, 0.001, 512)
    # position j pays 0.5 x 0.9^(j+1) - 0.026; its padding 0.001 x (rows - 1)
    assert small[0] == max(j + 1 for j in range(40) if 0.5 * 0.9 ** (j + 1) - 0.026 - 0.001 * 7 > 0)
    assert large[0] == 0  # 0.511 ms of padding per position: more than the first position's 0.45 ms saving
    assert cap_longest_draft(useful, lengths, value, 0.026, 0.0, 512)[0] == 40  # free logprobs: nothing cut
    # no padding (one row): a position that does not pay for its own verification is the cut's business
    assert cap_longest_draft(useful, lengths, np.array([0.01]), 0.026, 0.001, 1)[0] == 40
