"""propose_batch: the batch API returns what per-request propose returns, with the acceptance estimates."""

import numpy as np
import pytest

from drafter_utils import make_drafter
from das_trl.drafter.draft_batch import NO_SOURCE, DraftBatch


def _setup(rng, n_problems=3, samples=4):
    prompts = [rng.integers(1000, 1200, 20).tolist() for _ in range(n_problems)]
    comps = [[rng.integers(1000, 1040, 80).tolist() for _ in range(samples)] for _ in prompts]
    return prompts, comps


def test_batch_equals_per_request_propose(rng):
    prompts, comps = _setup(rng)
    a, b = make_drafter(), make_drafter()
    for d in (a, b):
        d.add_rollouts([p for p, cs in zip(prompts, comps) for _ in cs], [c for cs in comps for c in cs])
    ids = [f"r{i}" for i in range(len(prompts))]
    outputs = [c[0][:30] for c in comps]
    for d in (a, b):
        for rid, p, out in zip(ids, prompts, outputs):
            d.start_request(rid, p)
            d.extend_request(rid, out)
    budgets = np.array([16, 3, 0])
    batch = a.propose_batch(ids, budgets)
    singles = [b.propose(rid, p + out, int(k)) for rid, p, out, k in zip(ids, prompts, outputs, budgets)]
    assert batch.as_lists() == singles
    assert batch.lengths[2] == 0 and batch.source[2] == NO_SOURCE
    for i, draft in enumerate(singles):
        acc = batch.accept[i, : len(draft)]
        assert np.all(acc > 0) and np.all(np.diff(acc) <= 1e-12)  # cumulative: non-increasing
        assert np.all(batch.accept[i, len(draft):] == 0)
    assert a.stats()["draft_tokens"] == b.stats()["draft_tokens"]


def test_batch_context_none_uses_own_text(rng):
    prompts, comps = _setup(rng, 1, 2)
    d = make_drafter()
    d.add_rollouts([prompts[0]] * 2, comps[0])
    d.start_request("r", prompts[0])
    d.extend_request("r", comps[0][0][:10])
    own = d.propose_batch(["r"], [8]).row(0)
    explicit = d.propose("r", prompts[0] + comps[0][0][:10], 8)
    assert own == explicit and own


def test_truncate_and_errors():
    b = DraftBatch.empty(2, 4)
    b.tokens[:] = [[1, 2, 3, 4], [5, 6, 0, 0]]
    b.lengths[:] = [4, 2]
    b.accept[:] = [[0.9, 0.8, 0.7, 0.6], [0.5, 0.4, 0, 0]]
    b.source[:] = [0, 1]
    b.truncate(np.array([2, 0]))
    assert b.as_lists() == [[1, 2], []]
    assert b.accept[0].tolist() == [0.9, 0.8, 0, 0] and b.source[1] == NO_SOURCE
    with pytest.raises(ValueError):
        b.truncate(np.array([1]))
    d = make_drafter()
    with pytest.raises(ValueError):
        d.propose_batch(["a"], [1, 2])
    with pytest.raises(KeyError):
        d.propose_batch(["nope"], [4])


def test_truncate_rows_equals_truncate_on_the_rows_and_writes_in_place(rng):
    """truncate_rows (the Speculator's cut of the drafted rows) gives what truncate gives with the other rows'
    budgets at their lengths, in the same arrays (a buffer's views stay valid), rows untouched otherwise."""
    n, k = 12, 6
    for _ in range(20):
        b = DraftBatch.empty(n, k)
        b.lengths[:] = rng.integers(0, k + 1, n)
        cols = np.arange(k)[None, :] < b.lengths[:, None]
        b.tokens[:] = np.where(cols, rng.integers(1, 50, (n, k)), 0)
        b.accept[:] = np.where(cols, np.sort(rng.random((n, k)), axis=1)[:, ::-1], 0.0)
        b.source[:] = np.where(b.lengths > 0, rng.integers(0, 3, n), NO_SOURCE)
        b.match_len[:] = np.where(b.lengths > 0, rng.integers(1, 9, n), 0)
        rows = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
        keep = rng.integers(-1, k + 2, len(rows))
        ref = DraftBatch(*(a.copy() for a in (b.tokens, b.lengths, b.accept, b.source, b.match_len)))
        budgets = ref.lengths.astype(np.int64)
        budgets[rows] = keep
        ref.truncate(budgets)
        arrays = (b.tokens, b.lengths, b.accept, b.source, b.match_len)
        b.truncate_rows(rows, keep)
        assert all(x is y for x, y in zip(arrays, (b.tokens, b.lengths, b.accept, b.source, b.match_len)))
        for name in ("tokens", "lengths", "accept", "source", "match_len"):
            assert np.array_equal(getattr(b, name), getattr(ref, name)), name
    with pytest.raises(ValueError):
        b.truncate_rows(np.array([0, 1]), np.array([1]))


def test_truncate_rows_rejects_bad_rows_and_budgets():
    b = DraftBatch.empty(3, 4)
    b.lengths[:] = [4, 2, 0]
    for rows, budgets in (([-1], [1]), ([3], [1]), ([0], [np.nan]), ([0.0], [1])):
        with pytest.raises(ValueError):
            b.truncate_rows(np.array(rows), np.array(budgets))
    assert b.lengths.tolist() == [4, 2, 0]
