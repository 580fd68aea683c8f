import numpy as np

from das_trl.drafter import RolloutHistory


def seqs(n, length, start=0):
    return [np.arange(start + i, start + i + length, dtype=np.int32) for i in range(n)]


def test_window_keeps_last_w_appearances():
    h = RolloutHistory(window=3, token_budget=10**9)
    evicted = []
    for step in range(5):
        evicted += h.add(7, seqs(2, 10, start=step * 100))
    kept = [a.completions[0][0] for a in h.appearances(7)]
    assert kept == [200, 300, 400]
    assert [e[0] for e in evicted] == [7, 7]
    assert h.stats()["appearances"] == 3 and h.stats()["evicted_appearances"] == 2
    assert h.stats()["tokens"] == 3 * 2 * 10


def test_budget_evicts_oldest_first_across_problems_and_counts():
    h = RolloutHistory(window=10, token_budget=100)
    ids = []
    for step, key in enumerate([1, 2, 3, 1, 2]):
        h.add(key, seqs(3, 10, start=step))  # 30 tokens each
        ids.append(h.last_appearance_id)
    st = h.stats()
    assert st["tokens"] <= 100
    assert st["evicted_appearances"] == 2
    assert [a.appearance_id for a in h.appearances()] == ids[2:]
    assert sorted(h.problems()) == [1, 2, 3]


def test_budget_eviction_returns_keys_and_ids():
    h = RolloutHistory(window=10, token_budget=50)
    h.add(1, seqs(1, 30))
    first = h.last_appearance_id
    out = h.add(2, seqs(1, 30))
    assert out == [(1, first)]


def test_empty_completions_ignored_and_lengths():
    h = RolloutHistory(window=4, token_budget=1000)
    assert h.add(5, [np.zeros(0, np.int32)]) == []
    assert h.stats()["appearances"] == 0
    h.add(5, [np.arange(4, dtype=np.int32), np.zeros(0, np.int32), np.arange(7, dtype=np.int32)])
    assert h.lengths(5).tolist() == [4, 7]
    assert h.lengths(99).tolist() == []
    assert h.stats()["sequences"] == 2


def test_state_round_trip(tmp_path):
    h = RolloutHistory(window=2, token_budget=10**6)
    for step in range(4):
        h.add(step % 2, seqs(2, 5, start=step), prompt_tail=np.array([9, 9], np.int32))
    path = tmp_path / "h.npz"
    np.savez(path, **h.to_state())
    loaded = dict(np.load(path, allow_pickle=False))
    h2 = RolloutHistory.from_state(loaded)
    assert h2.stats() == h.stats()
    a1 = [(a.appearance_id, a.problem_key, [c.tolist() for c in a.completions], a.prompt_tail.tolist())
          for a in h.appearances()]
    a2 = [(a.appearance_id, a.problem_key, [c.tolist() for c in a.completions], a.prompt_tail.tolist())
          for a in h2.appearances()]
    assert a1 == a2
    h2.add(0, seqs(1, 3))
    assert h2.last_appearance_id == h.last_appearance_id + 1
