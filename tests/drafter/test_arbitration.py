import pytest

from drafter_utils import make_drafter
from das_trl.drafter.reference.arbitration import Candidate, choose, confidence
from das_trl.drafter import problem_key as pkey


def test_confidence_grows_with_support_and_match_len():
    # A tree continuation is backed by >= 1 sequence even when the g-gram count is 0 (match shorter than g - 1).
    assert confidence(0, 10, 2.0, 1.0) == confidence(1, 10, 2.0, 1.0) > 0.0
    assert confidence(5, 0, 2.0, 1.0) == 0.0
    assert confidence(2, 10, 2.0, 1.0) < confidence(30, 10, 2.0, 1.0)
    assert confidence(10, 1, 2.0, 1.0) < confidence(10, 20, 2.0, 1.0)
    assert confidence(2, 1, 2.0, 0.0) == pytest.approx(0.5)


def test_choose_prefers_support_over_raw_score():
    few = Candidate("problem", [1, 2, 3, 4], [1.0] * 4, match_len=4, support=1)
    many = Candidate("global", [5, 6, 7, 8], [0.85] * 4, match_len=4, support=200)
    assert few.raw_score > many.raw_score
    best = choose([few, many], kappa=2.0, mu=1.0, min_token_prob=0.1)
    assert best is many and best.token_ids == [5, 6, 7, 8]


def test_choose_truncates_below_min_prob_and_none_when_empty():
    c = Candidate("local", [1, 2, 3], [1.0, 0.5, 0.2], match_len=100, support=100)
    assert choose([c], 2.0, 1.0, 0.3).token_ids == [1, 2]
    weak = Candidate("problem", [1], [1.0], match_len=1, support=0)  # 1/3 * 1/2 < 0.2
    assert choose([weak], 2.0, 1.0, 0.2) is None
    assert choose([], 2.0, 1.0, 0.1) is None


def _build_conflict(rng, d):
    """Problem P: 2 samples continue the phrase C with X. 40 other problems continue C
    with Y (36) or Z (4). A new request of P whose own text only shares C with P's
    history should follow the well-supported Y."""
    r = lambda n: rng.integers(1000, 30000, n).tolist()
    C = r(4)
    X, Y, Z = r(20), r(20), r(20)
    pP = r(30)
    d.add_rollouts([pP, pP], [r(15) + C + X, r(15) + C + X])
    others = [r(30) for _ in range(40)]
    d.add_rollouts(others, [r(15) + C + (Y if i < 36 else Z) for i in range(40)])
    ctx = pP + r(25) + C  # fresh text, then the common phrase
    return pP, ctx, C, X, Y


def test_evidence_beats_raw_score_two_sample_problem_tree(rng):
    d = make_drafter(use_local_tree=False)
    pP, ctx, C, X, Y = _build_conflict(rng, d)
    cands = d._index.candidates(pkey(pP), ctx, 16)
    by_src = {c.source: c for c in cands}
    # The case is meaningful: arctic's rule (highest raw score) would draft X.
    assert by_src["problem"].token_ids[0] == X[0] and by_src["global"].token_ids[0] == Y[0]
    assert by_src["problem"].raw_score > by_src["global"].raw_score
    assert by_src["problem"].support == 2 and by_src["global"].support >= 36
    d.start_request("r", pP)
    out = d.propose("r", ctx, 16)
    assert out and out == Y[: len(out)]
    assert d.stats()["wins"]["global"] == 1


def test_problem_tree_wins_once_its_evidence_is_strong(rng):
    d = make_drafter(use_local_tree=False)
    pP, ctx, C, X, Y = _build_conflict(rng, d)
    r = lambda n: rng.integers(1000, 30000, n).tolist()
    # Many more samples of P, all continuing C with X: now X is the better-supported draft.
    d.add_rollouts([pP] * 30, [r(15) + C + X for _ in range(30)])
    d.start_request("r", pP)
    out = d.propose("r", ctx, 16)
    assert out and out == X[: len(out)]
    assert d.stats()["wins"]["problem"] == 1
