"""BudgetController.plan / cut: the gate drafts only rows that can pay (the proposer's CPU counted), the native cut
equals numpy's, decisions are deterministic (no generator state), and tail probabilities are reused between
recomputations. Fast."""

import numpy as np
import pytest

from das_trl.budget import BudgetController, ControllerConfig
from das_trl.budget.gate import gate_rows
from das_trl.budget.remaining import stratified_draws, tau_quantiles, tau_samples
from das_trl.drafter import native


def _controller(**cfg):
    ctl = BudgetController(ControllerConfig(cost_source="config", **cfg))
    rng = np.random.default_rng(3)
    for key in range(12):
        ctl.observe(key, rng.integers(20, 400, 8).tolist())
    return ctl


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 14, n)  # some problems without history
    out_len = rng.integers(0, 300, n)
    rounds = np.maximum(1, out_len // 2)
    acc = np.sort(rng.random((n, 16)), axis=1)[:, ::-1].copy()
    acc[rng.random(n) < 0.3, 6:] = 0.0
    return keys, out_len, rounds, acc


def test_stratified_draws_are_permutations_of_the_strata():
    d = stratified_draws(3, 32)
    assert d.shape == (4, 3, 32) and (d[:, 0] == d[:, 2]).all()
    for row in d[:, 0]:
        assert np.allclose(np.sort(row), (np.arange(32) + 0.5) / 32)
    assert not np.allclose(d[0, 0], d[1, 0])


def test_gate_needs_the_saving_to_pay_for_verification_and_the_proposers_cpu():
    w = np.array([0.0, 0.01, 0.01, 1.0, 1.0])
    q = np.array([0.9, 0.5, 0.95, 0.05, 0.5])
    caps = np.array([16, 16, 16, 16, 0])
    ok = gate_rows(w, q, caps, c_tok_ms=0.025, draft_row_ms=0.005)
    # P = 0 never pays; a cheap row pays only at high acceptance; the tail row pays even at low acceptance; cap 0 never
    assert ok.tolist() == [False, False, True, True, False]
    assert not gate_rows(w, q, caps, c_tok_ms=0.025, draft_row_ms=1.0).any()  # an expensive proposer drafts nothing


@pytest.mark.skipif(not native.available(), reason="needs the native core (built by the setup script)")
def test_native_cut_equals_numpy():
    for seed in range(5):
        keys, out_len, rounds, acc = _batch(40, seed)
        results = []
        for backend in ("native", "python"):
            ctl = _controller(backend=backend)
            plan = ctl.plan(keys, out_len, rounds, out_len + 200)
            rows = np.flatnonzero(plan.draft)
            results.append((plan.draft.copy(), plan.weight_ms.copy(), ctl.cut(plan, acc[rows], rows),
                            ctl.last_expected_kept.copy(), ctl.stats()))
        (d1, w1, c1, k1, s1), (d2, w2, c2, k2, s2) = results
        assert (d1 == d2).all() and np.allclose(w1, w2)
        assert np.mean(c1 == c2) > 0.95 and np.allclose(k1[c1 == c2], k2[c1 == c2])
        # the kernel's counters (offered / kept tokens, drafting rows, expected accepted) are the numpy path's
        assert s1["offered_tokens"] == s2["offered_tokens"] == int((acc[np.flatnonzero(d1)] > 0).sum())
        if (c1 == c2).all():
            for key in ("kept_tokens", "rows_drafting"):
                assert s1[key] == s2[key] == (int(c1.sum()) if key == "kept_tokens" else int((c1 > 0).sum()))
            assert s1["expected_accepted"] == pytest.approx(s2["expected_accepted"], rel=1e-9)


@pytest.mark.skipif(not native.available(), reason="needs the native core (built by the setup script)")
def test_native_gate_stops_walking_a_row_with_the_same_decisions_as_numpy():
    """The plan kernel stops a row's walk over draft lengths once a position is worth less than its verification;
    on rows whose saving peaks anywhere from the first position to the 64th (acceptance up to 0.999, the proposer's
    CPU per row up to 0.5 ms, hard caps 1-64) it drafts exactly the rows numpy's full walk (gate_rows) drafts, given
    the kernel's own weights."""
    rng = np.random.default_rng(11)
    drafted = 0
    for trial in range(8):
        row_us = [0.0, 20.0, 100.0, 500.0][trial % 4]
        ctl = BudgetController(ControllerConfig(cost_source="config", backend="native", draft_row_us=row_us,
                                                c_tok_ms=[0.005, 0.025, 0.1][trial % 3], always_plan_rows=0))
        for key in range(4):
            ctl.observe(key, rng.integers(50, 3000, 8).tolist())
        n = 400
        q = 1.0 - rng.random(n) ** 3  # many rows near 1, where the saving peaks late
        caps = rng.integers(1, 65, n).astype(np.int32)
        plan = ctl.plan(rng.integers(0, 5, n), rng.integers(0, 500, n), None, None, caps, q, np.arange(n))
        expect = gate_rows(plan.weight_ms, q, caps, ctl.cost.token_ms, row_us / 1000.0, 0.0)
        assert (plan.draft == expect).all(), np.flatnonzero(plan.draft != expect)
        drafted += int(expect.sum())
    assert 0 < drafted


@pytest.mark.skipif(not native.available(), reason="needs the native core (built by the setup script)")
def test_native_cut_stops_at_the_draft_s_end_with_numpy_s_lengths():
    """The cut kernel walks a row only up to its last nonzero estimate (the draft's end); with every position sure
    to lie before the request's end (survival 1 in both paths) its kept lengths and values are numpy's exactly, on
    drafts of every length whose best cut falls anywhere from 0 to the full draft."""
    rng = np.random.default_rng(5)
    for backend_pair in range(4):
        ctls = [BudgetController(ControllerConfig(cost_source="config", backend=b, c_tok_ms=0.025, length_jitter=0.0,
                                                  pooled_weight=0.0)) for b in ("native", "python")]
        for ctl in ctls:
            ctl.observe(0, [100_000] * 8)  # far beyond every draft: survival 1
        n, k = 300, 64
        ends = rng.integers(0, k + 1, n)
        acc = np.minimum.accumulate(rng.random((n, k)) ** 0.2, axis=1)
        acc[np.arange(k)[None, :] >= ends[:, None]] = 0.0
        keys, out_len = np.zeros(n, np.int64), np.zeros(n, np.int64)
        got = []
        for ctl in ctls:
            plan = ctl.plan(keys, out_len, None, None, np.full(n, 64), None, None)
            plan.weight_ms[:] = rng.random(n) ** 3 * 7.0 if not got else got[0][2]  # the same weights in both
            got.append((ctl.cut(plan, acc), ctl.last_expected_kept.copy(), plan.weight_ms.copy()))
        (kn, en, _), (kp, ep, _) = got
        assert (kn == kp).all(), np.flatnonzero(kn != kp)
        np.testing.assert_allclose(en, ep, rtol=1e-12, atol=1e-15)
        assert 0 < kn.min() or (ends == 0).any()
        assert (kn == ends).any() and (kn < ends).any()  # full drafts kept and drafts cut short both occur


def test_plans_are_deterministic_and_reused_between_recomputations():
    keys, out_len, rounds, _ = _batch(64)
    a, b = _controller(replan_steps=4, always_plan_rows=0), _controller(replan_steps=4, always_plan_rows=0)
    slots = np.arange(64)
    for step in range(6):
        pa = a.plan(keys, out_len + step, rounds + step, None, None, None, slots)
        pb = b.plan(keys, out_len + step, rounds + step, None, None, None, slots)
        assert (pa.draft == pb.draft).all() and (pa.weight_ms == pb.weight_ms).all()
        assert pa.replanned == (step % 4 == 0)
    # rows leaving renormalise the kept probabilities; a new slot forces a recomputation
    p = a.plan(keys[:60], out_len[:60], rounds[:60], None, None, None, slots[:60])
    assert not p.replanned and p.weight_ms.sum() == pytest.approx(7.0)
    assert a.plan(keys[:60], out_len[:60], rounds[:60], None, None, None, slots[:60] + 100).replanned
    assert a.stats()["replans"] == 3


def test_cut_keeps_no_more_than_the_draft_and_validates():
    keys, out_len, rounds, acc = _batch(8)
    ctl = _controller()
    plan = ctl.plan(keys, out_len, rounds)
    kept = ctl.cut(plan, acc)
    assert kept.dtype == np.int32 and ((0 <= kept) & (kept <= (acc > 0).sum(axis=1))).all()
    with pytest.raises(ValueError, match="one row per drafted row"):
        ctl.cut(plan, acc[:3])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ctl.cut(plan, acc * 2)
    for rows in ([0, 1, -1], [0, 1, 8]):  # outside the plan's 8 rows: both backends, before anything is counted
        with pytest.raises(ValueError, match="rows must index the plan's 8 rows"):
            ctl.cut(plan, acc[:3], np.array(rows))


@pytest.mark.parametrize("backend", ["native", "python"])
def test_cut_rejects_nan_estimates_and_counts_nothing(backend):
    if backend == "native" and not native.available():
        pytest.skip("needs the native core (built by the setup script)")
    keys, out_len, rounds, acc = _batch(8)
    ctl = _controller(backend=backend)
    plan = ctl.plan(keys, out_len, rounds)
    before = ctl.stats()
    acc[3, 2] = np.nan
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ctl.cut(plan, acc)
    after = ctl.stats()
    assert all(after[k] == before[k] for k in ("offered_tokens", "kept_tokens", "rows_drafting"))


def test_quiet_step_skips_the_plan_only_after_a_silent_plan_and_until_a_recomputation_is_due():
    keys, out_len, rounds, _ = _batch(64)
    slots = np.arange(64)
    low = np.full(64, 0.01)  # nothing pays at this acceptance
    ctl = _controller(replan_steps=4, always_plan_rows=32)
    assert not ctl.quiet_step(slots)  # nothing planned yet
    plan = ctl.plan(keys, out_len, rounds, None, None, low, slots)
    assert plan.replanned and not plan.draft.any()
    assert [ctl.quiet_step(slots) for _ in range(4)] == [True, True, True, False]  # the 4th step recomputes
    assert ctl.plan(keys, out_len, rounds, None, None, low, slots).replanned
    assert ctl.quiet_step(slots)
    assert not ctl.quiet_step(np.append(slots, 99))       # a request the last plan did not see
    assert not ctl.quiet_step(slots[:50])                 # the batch shrank by more than replan_shrink
    assert not ctl.quiet_step(slots[:32])                 # small batches plan every step
    s = ctl.stats()
    assert s["quiet_steps"] == 4 and s["silent_steps"] == 6 and s["steps"] == 6
    # a plan that drafts something ends the quiet steps
    ctl.plan(keys, out_len, rounds, None, None, np.full(64, 0.9), slots)
    assert not ctl.quiet_step(slots)


def test_quiet_step_with_the_same_rows_skips_only_the_seen_check_and_only_until_a_recomputation():
    keys, out_len, rounds, _ = _batch(64)
    slots = np.arange(64)
    low = np.full(64, 0.01)
    ctl = _controller(replan_steps=8, always_plan_rows=32)
    ctl.plan(keys, out_len, rounds, None, None, low, slots)
    ctl._slot_epoch[:] = -1  # as if no row had been seen: only the check reads it
    assert ctl.quiet_step(slots, same_rows=True)  # the caller's promise: the check is skipped
    assert not ctl.quiet_step(slots)              # without it the check runs (and fails here)
    # a recomputation starts a new epoch: the promise alone no longer skips the check
    ctl._epoch += 1
    assert not ctl.quiet_step(slots, same_rows=True)
    # the interval rules still apply with the promise
    ctl2 = _controller(replan_steps=3, always_plan_rows=32)
    ctl2.plan(keys, out_len, rounds, None, None, low, slots)
    assert [ctl2.quiet_step(slots, same_rows=True) for _ in range(3)] == [True, True, False]


def _quiet_run(ctl, keys, out_len, rounds, acc, slots, steps):
    """Steps as the Speculator takes them: quiet_step, else plan. Returns the steps (0-based) that planned, and
    whether each plan recomputed."""
    planned = []
    for step in range(steps):
        if step and ctl.quiet_step(slots):
            continue
        plan = ctl.plan(keys, out_len + step, rounds + step, None, None, acc, slots)
        planned.append((step, plan.replanned, bool(plan.draft.any())))
    return planned


def test_quiet_recomputations_back_off_while_nothing_pays():
    keys, out_len, rounds, _ = _batch(64)
    slots = np.arange(64)
    low = np.full(64, 0.01)  # nothing pays at this acceptance
    ctl = _controller()  # replan_steps 8, quiet_replan_max_steps 64
    planned = _quiet_run(ctl, keys, out_len, rounds, low, slots, 400)
    assert all(replanned and not drafted for _, replanned, drafted in planned)
    steps = [s for s, _, _ in planned]
    assert np.diff(steps).tolist()[:6] == [8, 16, 32, 64, 64, 64]
    assert len(steps) == 1 + 4 + (400 - 1 - 120) // 64  # 0, 8, 24, 56, 120, then every 64
    assert ctl.stats()["replans"] == len(steps) and ctl.stats()["replan_interval"] == 64
    assert ctl.stats()["quiet_steps"] == 400 - len(steps)
    # plan() itself follows the same interval (a step that plans without asking quiet_step, e.g. a request drafted
    # last step, does not recompute before the backed-off interval is due)
    ctl = _controller()
    _quiet_run(ctl, keys, out_len, rounds, low, slots, 9)  # recomputed at 0 and 8: the interval is now 16
    replanned = [ctl.plan(keys, out_len, rounds, None, None, low, slots).replanned for _ in range(16)]
    assert replanned == [False] * 15 + [True]
    # quiet_replan_max_steps <= replan_steps: every replan_steps, as before the backoff
    for off in (8, 0):
        ctl = _controller(quiet_replan_max_steps=off)
        steps = [s for s, _, _ in _quiet_run(ctl, keys, out_len, rounds, low, slots, 400)]
        assert steps == list(range(0, 400, 8)) and ctl.stats()["replan_interval"] == 8
    # the cap need not be a power-of-two multiple
    ctl = _controller(replan_steps=5, quiet_replan_max_steps=30)
    steps = [s for s, _, _ in _quiet_run(ctl, keys, out_len, rounds, low, slots, 200)]
    assert np.diff(steps).tolist()[:5] == [5, 10, 20, 30, 30]


def test_a_plan_that_drafts_resets_the_recomputation_interval():
    keys, out_len, rounds, _ = _batch(64)
    slots = np.arange(64)
    low, high = np.full(64, 0.01), np.full(64, 0.9)
    ctl = _controller()
    steps = [s for s, _, _ in _quiet_run(ctl, keys, out_len, rounds, low, slots, 25)]
    assert steps == [0, 8, 24] and ctl.stats()["replan_interval"] == 32
    # a plan that drafts (even one that did not recompute) ends the backoff
    plan = ctl.plan(keys, out_len, rounds, None, None, high, slots)
    assert plan.draft.any() and not plan.replanned
    assert ctl.stats()["replan_interval"] == 8
    # and the next silent stretch starts again from replan_steps: recomputed 8 steps after the last recomputation
    ctl.plan(keys, out_len, rounds, None, None, low, slots)  # silent, kept P (2 steps since the recomputation)
    quiet = [ctl.quiet_step(slots) for _ in range(6)]
    assert quiet == [True] * 5 + [False]
    assert ctl.plan(keys, out_len, rounds, None, None, low, slots).replanned
    assert ctl.stats()["replan_interval"] == 8  # the first silent recomputation after a draft does not double


def test_new_requests_and_shrinks_still_force_a_plan_during_the_backoff():
    keys, out_len, rounds, _ = _batch(64)
    slots = np.arange(64)
    low = np.full(64, 0.01)
    ctl = _controller()
    _quiet_run(ctl, keys, out_len, rounds, low, slots, 121)
    assert ctl.stats()["replan_interval"] == 64  # recomputed at step 120: 63 quiet steps allowed from here
    assert ctl.quiet_step(slots)
    new = np.append(slots[:-1], 200)  # one request ended, a new one (slot not seen at the last plan) joined
    assert not ctl.quiet_step(new)
    assert ctl.plan(keys, out_len, rounds, None, None, low, new).replanned
    assert ctl.quiet_step(new)
    assert not ctl.quiet_step(new[:50])  # shrank by more than replan_shrink
    assert ctl.plan(keys[:50], out_len[:50], rounds[:50], None, None, low[:50], new[:50]).replanned
    assert not ctl.quiet_step(new[:32])  # small batches plan every step
    assert ctl.plan(keys[:32], out_len[:32], rounds[:32], None, None, low[:32], new[:32]).replanned
    online = BudgetController(ControllerConfig(cost_source="online"))
    online.plan(keys, out_len, rounds, None, None, low, slots)
    assert not online.quiet_step(slots)  # the online cost fit plans every step


def test_quiet_replan_max_steps_is_validated():
    for bad in (-1, 2.5, True, "64"):
        with pytest.raises(ValueError, match="quiet_replan_max_steps"):
            ControllerConfig(quiet_replan_max_steps=bad)


def test_tau_samples_spread_shrinks_with_evidence_and_never_goes_below_one_token():
    z = tau_quantiles(32)
    assert sorted(z) == pytest.approx(sorted(-z)) and abs(float(np.median(z))) < 0.05  # symmetric quantiles
    tau = np.array([1.0, 2.0, 2.0, 2.0])
    rounds = np.array([10.0, 4.0, 400.0, 400.0])
    rem_mean = np.array([200.0, 200.0, 200.0, 20000.0])
    got = tau_samples(tau, rounds, rem_mean, z, 1.0)
    assert got.shape == (4, 32) and got.min() >= 1.0
    spread = np.log(got).std(axis=1)
    assert spread[1] > spread[2] > spread[3] > 0  # fewer rounds seen or to come: less certain of the speed
    np.testing.assert_allclose(np.exp(np.log(got[1:]).mean(axis=1)), 2.0, rtol=1e-9)  # centred (log) on tau_obs
    np.testing.assert_array_equal(tau_samples(tau, rounds, rem_mean, z, 0.0), np.broadcast_to(tau[:, None], (4, 32)))


def test_tau_uncertainty_spreads_the_tail_over_a_crowd_cut_at_the_same_length():
    """Rows that must all reach the same max_tokens, one a little slower so far: with the observed speed taken as
    exact, their rounds to finish fall in the same bin of the tail histogram and they share equally; with the speed's
    uncertainty the slower row gets the largest share and the others keep one."""
    keys = np.zeros(6, np.int64)
    out_len = np.full(6, 100)
    rounds = np.array([56, 52, 52, 52, 52, 52])  # row 0 has emitted the fewest tokens per round
    probs = []
    for u in (0.0, 1.0):
        ctl = BudgetController(ControllerConfig(tau_uncertainty=u, tail_prior_weight=0.0, length_jitter=0.0))
        ctl.observe(0, [400] * 8)
        ctl.plan(keys, out_len, rounds, np.full(6, 400), acceptance=np.full(6, 0.5))
        probs.append(ctl.last_tail_prob.copy())
    np.testing.assert_allclose(probs[0], 1 / 6)
    assert probs[1][0] > 2 * probs[1][1:].max() and probs[1][1:].min() > 0.05
    for backend in ("native", "python") if native.available() else ("python",):  # the kernel agrees
        ctl = BudgetController(ControllerConfig(tau_uncertainty=1.0, tail_prior_weight=0.0, length_jitter=0.0,
                                                backend=backend))
        ctl.observe(0, [400] * 8)
        ctl.plan(keys, out_len, rounds, np.full(6, 400), acceptance=np.full(6, 0.5))
        np.testing.assert_allclose(ctl.last_tail_prob, probs[1], rtol=1e-9)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_row_that_rarely_sends_pays_its_cpu_per_draft_sent(backend):
    """The gate charges draft_row_us / send: a row whose drafts mostly do not survive the cut needs a larger expected
    gain to be speculated; send = 1 is the gate without it."""
    if backend == "native" and not native.available():
        pytest.skip("the native core is not built")
    ctl = BudgetController(ControllerConfig(backend=backend, draft_row_us=20.0, c_tok_ms=0.1))
    ctl.observe(0, [300] * 8)
    n = 40
    args = (np.zeros(n, np.int64), np.full(n, 100), np.full(n, 60), np.full(n, 400), np.full(n, 16, np.int32),
            np.linspace(0.3, 0.95, n), np.arange(n))
    always = ctl.plan(*args).draft
    rarely = ctl.plan(*args, send=np.full(n, 0.1)).draft
    assert always.sum() > rarely.sum() and not (rarely & ~always).any()
    assert (ctl.plan(*args, send=np.ones(n)).draft == always).all()


def test_draft_caps_follow_the_row_s_value_and_acceptance():
    """A row of a large batch (small weight) drafts a few tokens, the row likely to finish last (weight ~ c_base)
    up to its hard cap; lower acceptance, a dearer token or a cap below the minimum shorten it."""
    from das_trl.budget.gate import MIN_DRAFT_CAP, draft_caps

    caps = np.full(6, 64)
    w = np.array([0.01, 0.05, 7.0, 7.0, 0.05, 0.05])
    q = np.array([0.6, 0.6, 0.6, 0.95, 0.95, 0.3])
    out = draft_caps(w, q, caps, 0.025)
    floor = 0.025 / (w + 0.025)
    expect = np.minimum(64, np.maximum(MIN_DRAFT_CAP, np.ceil(2 * np.log(floor) / np.log(q))))
    assert out.tolist() == expect.astype(int).tolist()
    assert out[0] <= out[1] < out[2] < out[3] == 64 and out[5] == MIN_DRAFT_CAP
    assert (draft_caps(w, q, caps, 0.1) <= out).all()  # dearer verification: never longer
    assert (draft_caps(w, q, caps, 0.025, ratio=2.0) >= out).all()  # the cut may scale estimates up by the ratio
    assert draft_caps(w, q, np.full(6, 2), 0.025).tolist() == [2] * 6  # never above the hard cap
    assert draft_caps(np.array([0.0]), np.array([0.0]), np.array([64]), 0.025).tolist() == [MIN_DRAFT_CAP]


def test_plan_gives_drafted_rows_their_caps_and_others_none():
    ctl = BudgetController(ControllerConfig(cost_source="config", backend="python"))
    ctl.observe(0, [100, 120, 140])
    plan = ctl.plan(np.zeros(3, np.int64), np.array([10, 50, 130]), caps=np.array([64, 64, 0]),
                    acceptance=np.array([0.9, 0.9, 0.9]))
    assert plan.budget.dtype == np.int32 and ((plan.budget > 0) == plan.draft).all() and plan.budget[2] == 0


def _one_long_row_step(n, shape, backend):
    """A batch of ``n`` rows where row 0 (2,000-token problem) is sure to finish last and drafts at 95 % per token,
    the others (120-token problem, 20 tokens left) at 50 %: the plan, then the cut of drafts as long as the plan's
    budgets. Returns (row 0's planned budget, its kept draft, the controller's stats)."""
    ctl = BudgetController(ControllerConfig(cost_source="config", verification_shape=shape, backend=backend,
                                            pooled_weight=0.0))
    ctl.observe(0, [2000] * 8)
    ctl.observe(1, [120] * 8)
    keys = np.ones(n, np.int64)
    keys[0] = 0
    q = np.full(n, 0.5)
    q[0] = 0.95
    plan = ctl.plan(keys, np.full(n, 100), np.full(n, 50), None, np.full(n, 64), q, np.arange(n))
    rows = np.flatnonzero(plan.draft)
    acc = np.zeros((len(rows), 64))
    for i, r in enumerate(rows):
        acc[i, :plan.budget[r]] = q[r] ** np.arange(1, plan.budget[r] + 1)
    kept = ctl.cut(plan, acc, rows)
    kept0 = int(kept[0]) if len(rows) and rows[0] == 0 else 0
    return int(plan.budget[0]), kept0, ctl.stats()


@pytest.mark.parametrize("backend", ["python", pytest.param("native", marks=pytest.mark.skipif(
    not native.available(), reason="needs the native core (built by the setup script)"))])
def test_padded_logprobs_cut_the_long_draft_of_a_large_batch_and_patched_keeps_it(backend):
    """Where vLLM pads verification logprobs to rows x (longest + 1), each position of the one long draft costs a
    logprob row for every row of the batch (0.001 ms each: 0.5 ms at 512 rows, more than the ~0.36 ms a token of the
    last row's progress is worth at its best rate); with the patch it costs its own row only, at any batch size."""
    patched = {n: _one_long_row_step(n, "patched", backend) for n in (8, 64, 512)}
    padded = {n: _one_long_row_step(n, "padded", backend) for n in (8, 64, 512)}
    for n in (8, 64, 512):
        assert patched[n][1] >= 32 and patched[n][2]["padding_cut_steps"] == 0  # long whatever the batch
        assert padded[n][2]["padding_over_saving_steps"] == 0  # what is kept pays for its padding
    assert padded[8][1] >= 32  # 7 padding rows per position: the long draft still pays
    assert padded[512][1] < padded[64][1] < patched[64][1]  # the longer the padding, the shorter the draft
    assert padded[512][1] == 0 and padded[64][2]["padding_cut_steps"] == padded[512][2]["padding_cut_steps"] == 1
    assert padded[64][2]["padding_ms"] > 0 == padded[512][2]["padding_ms"]


@pytest.mark.parametrize("backend", ["python", "native"])
def test_the_length_table_as_wide_as_its_fullest_problem_plans_as_one_padded_to_max_lengths(backend, monkeypatch):
    """``LengthTable.gather`` returns ``[n, W]`` with ``W`` the most lengths a problem holds, not ``max_lengths``:
    every reader counts the lengths from the right, so the padding columns a full-width table adds change nothing.
    Plan, cut and budgets (numpy and native kernels) on the narrow table equal those on the same table padded to
    ``max_lengths`` (64)."""
    if backend == "native" and not native.available():
        pytest.skip("needs the native core (built by the setup script)")
    from das_trl.budget.length_table import PAD, LengthTable

    keys, out_len, rounds, acc = _batch(60, seed=4)
    narrow = _controller(backend=backend)
    assert narrow.lengths.gather(keys)[0].shape == (60, 8) and narrow.lengths.max_lengths == 64

    real_gather = LengthTable.gather

    def padded_gather(self, problem_keys):
        table, counts, pooled = real_gather(self, problem_keys)
        wide = np.full((len(table), self.max_lengths), PAD)
        wide[:, self.max_lengths - table.shape[1]:] = table
        return wide, counts, pooled

    results = []
    for ctl in (narrow, None):
        if ctl is None:
            monkeypatch.setattr(LengthTable, "gather", padded_gather)
            ctl = _controller(backend=backend)
            assert ctl.lengths.gather(keys)[0].shape == (60, 64)
        plan = ctl.plan(keys, out_len, rounds, out_len + 200)
        rows = np.flatnonzero(plan.draft)
        results.append((plan.draft.copy(), plan.weight_ms.copy(), ctl.last_tail_prob.copy(), ctl.cut(plan, acc[rows], rows),
                        ctl.last_expected_kept.copy(), ctl.budgets(acc, keys, out_len, rounds, out_len + 200)))
    assert results[0][0].any() and results[0][3].sum() > 0  # the plan drafts and the cut keeps tokens
    for got, want in zip(*results):
        assert np.array_equal(got, want)
