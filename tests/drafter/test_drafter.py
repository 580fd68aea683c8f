import numpy as np
import pytest

from drafter_utils import make_drafter
from das_trl.drafter import problem_key
from das_trl.drafter.reference.support import scope_salt


def rand_seq(rng, n, lo=1000, hi=30000):
    return rng.integers(lo, hi, n).tolist()


def test_propose_continues_problem_history(rng):
    d = make_drafter()
    prompt = rand_seq(rng, 40)
    comp = rand_seq(rng, 200)
    d.add_rollouts([prompt] * 4, [comp] * 4)
    d.start_request("r", prompt)
    # First round: context is the prompt only; the prompt tail stored with history matches.
    assert d.propose("r", np.asarray(prompt), 8) == comp[:8]
    d.extend_request("r", comp[:50])
    assert d.propose("r", prompt + comp[:50], 16) == comp[50:66]
    assert d.stats()["wins"]["problem"] == 2


def test_global_fallback_for_unseen_problem(rng):
    d = make_drafter()
    shared = rand_seq(rng, 60)  # a pattern every problem's completions contain
    prompts = [rand_seq(rng, 30) for _ in range(8)]
    comps = [rand_seq(rng, 20) + shared + rand_seq(rng, 20) for _ in prompts]
    d.add_rollouts(prompts, comps)
    new_prompt = rand_seq(rng, 30)
    d.start_request("new", new_prompt)
    out = d.propose("new", new_prompt + shared[:10], 8)
    assert out == shared[10:18]
    assert d.stats()["wins"]["global"] == 1


def test_local_tree_drafts_from_own_repetition(rng):
    d = make_drafter(share_running_siblings=False)
    prompt = rand_seq(rng, 20)
    phrase = rand_seq(rng, 30)
    noise = rand_seq(rng, 5)
    d.start_request("r", prompt)
    d.extend_request("r", phrase + noise + phrase[:8])
    out = d.propose("r", prompt + phrase + noise + phrase[:8], 8)
    assert out == phrase[8:16]
    # Without the local tree nothing is known about this text.
    d2 = make_drafter(share_running_siblings=False, use_local_tree=False)
    d2.start_request("r", prompt)
    d2.extend_request("r", phrase + noise + phrase[:8])
    assert d2.propose("r", prompt + phrase + noise + phrase[:8], 8) == []


def test_running_siblings_see_each_other_and_are_not_double_counted(rng):
    d = make_drafter(share_running_batch=False)
    prompt = rand_seq(rng, 30)
    text = rand_seq(rng, 100)
    d.start_request("a", prompt)
    d.start_request("b", prompt)
    d.extend_request("a", text[:80])
    d.extend_request("b", text[:10])
    assert d.propose("b", prompt + text[:10], 8) == text[10:18]
    assert d.stats()["wins"]["siblings"] == 1
    # Finished sibling stays visible until its rollouts are pushed ...
    d.stop_request("a")
    assert d.propose("b", prompt + text[:20], 8) == text[20:28]
    assert d.stats()["lingering_finished"] == 1
    # ... then it lives in the history only (problem tree), not twice.
    d.add_rollouts([prompt], [text[:80]])
    assert d.stats()["lingering_finished"] == 0
    assert d._index._support.count(text[28:31], scope_salt(problem_key(prompt))) == 1
    assert d.propose("b", prompt + text[:30], 8) == text[30:38]
    assert d.stats()["wins"]["problem"] == 1


def test_siblings_off_hides_them(rng):
    d = make_drafter(share_running_siblings=False, share_running_batch=False)
    prompt, text = rand_seq(rng, 30), rand_seq(rng, 100)
    d.start_request("a", prompt)
    d.start_request("b", prompt)
    d.extend_request("a", text[:80])
    assert d.propose("b", prompt + text[:10], 8) == []


def test_batch_tree_shares_outputs_across_problems_until_pushed(rng):
    d = make_drafter(share_running_siblings=False)
    p1, p2, text = rand_seq(rng, 30), rand_seq(rng, 30), rand_seq(rng, 100)
    d.start_request("a", p1)
    d.start_request("b", p2)  # another problem
    d.extend_request("a", text[:80])
    d.extend_request("b", text[:10])
    assert d.propose("b", p2 + text[:10], 8) == text[10:18]
    assert d.stats()["wins"]["batch"] == 1
    d.stop_request("a")
    assert d.stats()["lingering_finished"] == 1
    # a's rollouts enter the history: its batch-tree copy is released (no double counting) ...
    d.add_rollouts([p1], [text[:80]])
    assert d.stats()["lingering_finished"] == 0
    # ... and b (a different problem) still drafts from the global history tree.
    assert d.propose("b", p2 + text[:20], 8) == text[20:28]
    assert d.stats()["wins"]["global"] == 1
    off = make_drafter(share_running_siblings=False, share_running_batch=False, use_global_tree=False)
    off.start_request("a", p1)
    off.start_request("b", p2)
    off.extend_request("a", text[:80])
    assert off.propose("b", p2 + text[:10], 8) == []


@pytest.mark.parametrize("bad", [[-1, 5], [2**31], [1.5, 2.0], ["x"], [True, 3], [[1, 2]]])
def test_invalid_rollouts_raise_and_leave_history_unchanged(rng, bad):
    d = make_drafter()
    prompt = rand_seq(rng, 10)
    d.add_rollouts([prompt], [rand_seq(rng, 50)])
    before = d.stats()
    with pytest.raises(ValueError):
        # A valid rollout first: it must not be applied either.
        d.add_rollouts([prompt, prompt], [rand_seq(rng, 50), bad])
    with pytest.raises(ValueError):
        d.add_rollouts([bad, prompt], [[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError):
        d.add_rollouts([prompt], [[1, 2]], problem_keys=[-3])
    with pytest.raises(ValueError):
        d.add_rollouts([prompt], [[1, 2], [3]])
    assert d.stats() == before


def test_empty_completions_ignored(rng):
    d = make_drafter()
    p = rand_seq(rng, 10)
    out = d.add_rollouts([p, p, rand_seq(rng, 10)], [[], rand_seq(rng, 20), []])
    assert out == {"problems": 1, "sequences": 1, "tokens": 20, "evicted": 0}
    assert d.stats()["appearances"] == 1


def test_max_tokens_caps(rng):
    d = make_drafter(max_spec_tokens=5)
    prompt, comp = rand_seq(rng, 40), rand_seq(rng, 200)
    d.add_rollouts([prompt] * 4, [comp] * 4)
    d.start_request("r", prompt)
    ctx = prompt + comp[:60]
    assert d.propose("r", ctx, 3) == comp[60:63]
    assert d.propose("r", ctx, 100) == comp[60:65]
    assert d.propose("r", ctx, 0) == []
    assert d.propose("r", ctx, -2) == []


def test_unknown_request_and_lifecycle_errors(rng):
    d = make_drafter()
    with pytest.raises(KeyError, match="not active"):
        d.propose("nope", [1, 2, 3], 4)
    with pytest.raises(KeyError):
        d.extend_request("nope", [1])
    with pytest.raises(KeyError):
        d.stop_request("nope")
    d.start_request("r", [1, 2, 3])
    with pytest.raises(ValueError):
        d.start_request("r", [1, 2, 3])
    assert d.active_requests == {"r"}
    d.stop_request("r")
    assert d.active_requests == set()
    d.reset()
    assert d.stats()["requests"] == 0


def test_explicit_problem_keys_group_rollouts(rng):
    d = make_drafter()
    comp = rand_seq(rng, 100)
    # Different prompts, same explicit problem: one appearance, and a request with that
    # key drafts from it even though its prompt differs.
    d.add_rollouts([rand_seq(rng, 10), rand_seq(rng, 10)], [comp, comp], problem_keys=[42, 42])
    assert d.stats()["appearances"] == 1
    d.start_request("r", rand_seq(rng, 10), problem_key=42)
    assert d.propose("r", rand_seq(rng, 5) + comp[:30], 6) == comp[30:36]
    assert d.stats()["wins"]["problem"] == 1


def _fill(d, rng, prompts, vocab, steps):
    for _ in range(steps):
        comps = [[int(t) for t in rng.choice(vocab, 300)] for _ in range(4 * len(prompts))]
        d.add_rollouts([p for p in prompts for _ in range(4)], comps)


def _proposals(d, queries):
    for i, (p, _) in enumerate(queries):
        d.start_request(str(i), p)
    return [d.propose(str(i), p + c, 16) for i, (p, c) in enumerate(queries)]


@pytest.mark.parametrize("steps,expect_evictions", [(2, False), (5, True)])
def test_state_dict_round_trip_gives_identical_proposals(rng, tmp_path, steps, expect_evictions):
    cfg = dict(window=3, history_token_budget=20_000)
    d = make_drafter(**cfg)
    prompts = [rand_seq(rng, 20) for _ in range(6)]
    vocab = rng.integers(1000, 1100, 50)  # small vocabulary: branching and partial probs
    _fill(d, rng, prompts, vocab, steps)
    assert (d.stats()["evicted_appearances"] > 0) == expect_evictions
    np.savez(tmp_path / "s.npz", **d.state_dict()["history"])
    d2 = make_drafter(**cfg)
    d2.load_state_dict({"history": dict(np.load(tmp_path / "s.npz"))})
    s1, s2 = d.stats(), d2.stats()
    for k in ("problems", "appearances", "sequences", "tokens", "evicted_appearances", "global_seqs"):
        assert s1[k] == s2[k], k
    queries = [(prompts[i % 6], [int(t) for t in rng.choice(vocab, 40)]) for i in range(60)]
    if expect_evictions:
        # arctic orders equally frequent children by insertion/removal history, so after
        # evictions the reference is a drafter that only ever saw the surviving history.
        ref = make_drafter(**cfg)
        for app in d._history.appearances():
            n = len(app.completions)
            ref.add_rollouts([app.prompt_tail.tolist()] * n, app.completions,
                             problem_keys=[app.problem_key] * n)
        assert ref.stats()["evicted_appearances"] == 0
        d = ref
    outs1, outs2 = _proposals(d, queries), _proposals(d2, queries)
    assert sum(map(len, outs1)) > 0
    assert outs1 == outs2


def test_live_token_budget_evicts_oldest_finished_outputs(rng):
    # Each finished output holds prompt tail (10) + output (20) = 30 live tokens. Budget 100: the 4th stop brings the
    # finished outputs to 120 > 100, so the oldest are dropped down to half the budget (50): three go, one stays.
    d = make_drafter(live_token_budget=100)
    prompt = rand_seq(rng, 10)
    outs = []
    held = []
    for i in range(5):
        outs.append(rand_seq(rng, 20))
        d.start_request(str(i), prompt)
        d.extend_request(str(i), outs[-1])
        d.stop_request(str(i))
        held.append(d.stats()["live_finished_tokens"])
    assert held == [30, 60, 90, 30, 60]
    stats = d.stats()
    assert stats["lingering_finished"] == 2
    assert stats["live_evicted_outputs"] == 3 and stats["live_evicted_tokens"] == 90
    assert stats["live_running_tokens"] == 0
    # The three oldest outputs are gone from the sibling and batch trees, the two newest still draft.
    d.start_request("q", prompt)
    assert d.propose("q", prompt + outs[2][:6], 8) == []
    assert d.propose("q", prompt + outs[4][:6], 8) == outs[4][6:14]


def test_live_pool_reports_running_and_finished_tokens(rng):
    d = make_drafter(live_token_budget=1000, prompt_tail_tokens=8)
    p1, p2 = rand_seq(rng, 12), rand_seq(rng, 12)
    d.start_request("a", p1)
    d.start_request("b", p2)
    d.extend_request("a", rand_seq(rng, 30))
    d.extend_request("b", rand_seq(rng, 5))
    s = d.stats()
    assert s["live_running_tokens"] == (8 + 30) + (8 + 5)
    assert s["live_finished_tokens"] == 0
    # local trees (prompt + output) + sibling and batch trees (tail + output each)
    assert s["live_tree_tokens"] == (12 + 30) + (12 + 5) + 2 * ((8 + 30) + (8 + 5))
    assert s["live_approx_bytes"] > 0
    d.stop_request("a")
    s = d.stats()
    assert (s["live_running_tokens"], s["live_finished_tokens"]) == (8 + 5, 8 + 30)
    assert s["live_tree_tokens"] == (12 + 5) + 2 * ((8 + 30) + (8 + 5))
    # A push of a's problem releases its finished output whatever the budget.
    d.add_rollouts([p1], [rand_seq(rng, 30)])
    s = d.stats()
    assert (s["lingering_finished"], s["live_finished_tokens"], s["live_evicted_outputs"]) == (0, 0, 0)
    d.stop_request("b")
    d.reset()
    s = d.stats()
    assert (s["live_running_tokens"], s["live_finished_tokens"], s["live_tree_tokens"]) == (0, 0, 0)


def test_live_token_budget_zero_keeps_no_finished_output(rng):
    d = make_drafter(live_token_budget=0)
    prompt = rand_seq(rng, 10)
    d.start_request("a", prompt)
    d.extend_request("a", rand_seq(rng, 20))
    d.stop_request("a")
    assert d.stats()["lingering_finished"] == 0
    assert d.stats()["live_tree_tokens"] == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_live_token_budget_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="live_token_budget"):
        make_drafter(live_token_budget=bad)


def test_add_rollouts_from_another_thread_while_proposing(rng):
    import threading

    d = make_drafter()
    prompt, comp = rand_seq(rng, 20), rand_seq(rng, 300)
    d.add_rollouts([prompt] * 2, [comp] * 2)
    d.start_request("r", prompt)
    batches = [([rand_seq(rng, 20)] * 4, [rand_seq(rng, 200) for _ in range(4)]) for _ in range(20)]
    errors = []

    def push():
        try:
            for ps, cs in batches:
                d.add_rollouts(ps, cs)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=push)
    t.start()
    outs = [d.propose("r", prompt + comp[:50], 8) for _ in range(200)]
    t.join()
    assert not errors
    assert all(o == comp[50:58] for o in outs)
    assert d.stats()["appearances"] == 21


def test_global_tree_takes_a_subset_of_each_appearance(rng):
    d = make_drafter(global_samples_per_appearance=1)
    p = rand_seq(rng, 10)
    d.add_rollouts([p] * 4, [rand_seq(rng, 30) for _ in range(4)])
    assert d.stats()["global_seqs"] == 1 and d.stats()["sequences"] == 4
    d.add_rollouts([p] * 4, [rand_seq(rng, 30) for _ in range(4)])  # removal path stays consistent
    assert make_drafter(global_samples_per_appearance=0).config.global_samples_per_appearance == 0


@pytest.mark.parametrize("bad", [dict(window=0), dict(max_spec_tokens=-1), dict(min_token_prob=1.5),
                                 dict(support_ngram=1), dict(evidence_pseudocount=0.0),
                                 dict(support_table_bits=40), dict(global_samples_per_appearance=-1)])
def test_config_validation(bad):
    from das_trl.drafter import DrafterConfig

    with pytest.raises(ValueError, match="DrafterConfig"):
        DrafterConfig(**bad)


@pytest.mark.parametrize("bad", [dict(use_problem_tree="no"), dict(calibrate_acceptance=1),
                                 dict(max_spec_factor=float("inf")), dict(max_spec_factor=3e9),
                                 dict(max_spec_offset=float("nan")), dict(max_spec_offset=1e300),
                                 dict(min_token_prob="0.1"), dict(evidence_pseudocount=True)])
def test_config_rejects_wrong_types_and_non_finite_spec_limits(bad):
    # Found by a new-user check: "no" read as True (and crashed the native core with std::bad_cast); a factor of
    # inf or 3e9 overflowed the native cap computation and every draft came back empty.
    from das_trl.drafter import DrafterConfig

    with pytest.raises(ValueError, match=f"DrafterConfig: {next(iter(bad))}"):
        DrafterConfig(**bad)


def test_largest_allowed_spec_factor_still_drafts(rng):
    from das_trl.drafter import DrafterConfig, create_drafter

    prompt, comp = rand_seq(rng, 40), rand_seq(rng, 200)
    for backend in ("python", "native"):
        d = create_drafter(DrafterConfig(backend=backend, max_spec_factor=1e4, max_spec_offset=1e4,
                                         support_table_bits=16))
        d.add_rollouts([prompt] * 4, [comp] * 4)
        d.start_request("r", prompt)
        d.extend_request("r", comp[:20])
        assert d.propose("r", None, 16) == comp[20:36], backend


@pytest.mark.parametrize("backend", ["python", "native"])
def test_bad_calls_raise_clear_errors_and_change_nothing(rng, backend):
    from das_trl.drafter import DrafterConfig, create_drafter

    d = create_drafter(DrafterConfig(backend=backend, max_spec_tokens=16, support_table_bits=16))  # the cap below
    prompt, comp = rand_seq(rng, 40), rand_seq(rng, 200)
    d.add_rollouts([prompt] * 4, [comp] * 4)
    d.start_request("r", prompt)
    d.extend_request("r", comp[:20])
    for bad_id in (None, ["r"], 1.5, True):
        with pytest.raises(ValueError, match="request_id must be a str or an int"):
            d.start_request(bad_id, prompt)
    assert d.active_requests == {"r"}
    for bad_budget in ("4", 2.7, float("nan"), True, None):
        with pytest.raises(ValueError, match="max_tokens must hold ints"):
            d.propose("r", None, bad_budget)
        with pytest.raises(ValueError, match="max_tokens must hold ints"):
            d.propose_batch(["r"], [bad_budget])
    for huge in (2**63, 2**64):  # a huge budget is capped, not an overflow
        assert d.propose("r", None, huge) == comp[20:36]
        assert d.propose_batch(["r"], [huge]).row(0) == comp[20:36]
    assert d.propose("r", None, 4.0) == comp[20:24]  # a whole float is a count
    with pytest.raises(ValueError, match="trim: lengths must be >= 0"):
        d.trim(["r"], [-1])
    with pytest.raises(ValueError, match="trim: lengths must hold ints"):
        d.trim(["r"], ["2"])
    d.trim(["r"], [2])  # still trims after the rejected calls
    history = lambda: [(k, d.history_lengths(k).tolist()) for k in sorted(d.history_problems())]  # noqa: E731
    before = history()
    for bad_state in ({}, [], {"history": {}}, {"history": {"version": 1}}):
        with pytest.raises(ValueError, match="state"):
            d.load_state_dict(bad_state)
    assert history() == before and before
    for bad_config in ("x", {}, {"backend": "native"}):
        with pytest.raises(TypeError, match="create_drafter takes a DrafterConfig"):
            create_drafter(bad_config)


def test_recent_appearance_weight_favours_the_newest_appearance(rng):
    prompt, ctx = rand_seq(rng, 30), rand_seq(rng, 8)
    old, new = rand_seq(rng, 12), rand_seq(rng, 12)
    picks = {}
    for weight in (1, 3):
        d = make_drafter(recent_appearance_weight=weight, use_global_tree=False, use_local_tree=False,
                         share_running_siblings=False, share_running_batch=False, evidence_pseudocount=0.01,
                         min_token_prob=0.0)
        d.add_rollouts([prompt] * 2, [ctx + old] * 2)  # older appearance: 2 samples continue with `old`
        d.add_rollouts([prompt], [ctx + new])  # newest appearance: 1 sample continues with `new`
        d.start_request("r", prompt)
        picks[weight] = d.propose("r", prompt + ctx, 4)
        tree = d._index._problem_trees[problem_key(prompt)]
        assert tree.num_seqs() == 3 + (weight - 1)  # the newest appearance's extra copies
        d.add_rollouts([prompt], [rand_seq(rng, 20)])  # a newer appearance takes the copies over
        assert tree.num_seqs() == 4 + (weight - 1)
    assert picks[1] == old[:4] and picks[3] == new[:4]


def test_second_check_findings(rng):
    # A second new-user check: huge ints in count fields, a switch set after construction (both std::bad_cast in the
    # native core), an int past float's range for the spec factor, and small unsigned dtypes as budgets / lengths.
    from das_trl.drafter import DrafterConfig, create_drafter

    for bad in (dict(live_token_budget=10**30), dict(prompt_tail_tokens=2**31), dict(min_match_len=2**40),
                dict(max_spec_factor=10**400)):
        with pytest.raises(ValueError, match=f"DrafterConfig: {next(iter(bad))}"):
            DrafterConfig(**bad)
    config = DrafterConfig(backend="native", support_table_bits=16)
    config.use_local_tree = "no"
    with pytest.raises(ValueError, match="use_local_tree must be a bool"):
        create_drafter(config)
    d = create_drafter(DrafterConfig(backend="native", support_table_bits=16))
    prompt, comp = rand_seq(rng, 40), rand_seq(rng, 200)
    d.add_rollouts([prompt] * 4, [comp] * 4)
    d.start_request("r", prompt)
    d.extend_request("r", comp[:20])
    for dtype in (np.uint8, np.uint16, np.int8, np.float16):
        assert d.propose_batch(["r"], np.array([4], dtype)).row(0) == comp[20:24], dtype
        d.trim(["r"], np.array([2], dtype))
