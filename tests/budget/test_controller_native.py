"""The budget controller's native kernel against the numpy reference (``ControllerConfig.backend``): same random draws,
same budgets and diagnostics up to floating-point rounding, on random batches (unknown problems, max_tokens caps, zero
acceptance tails, cheap and expensive verification); clear errors on bad shapes."""

import numpy as np
import pytest

from das_trl.drafter import native
from das_trl.budget import BudgetController, ControllerConfig



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
    assert [c.backend_in_use for c in (BudgetController(ControllerConfig()), capped,
                                       BudgetController(ControllerConfig(backend="python")))] == \
        ["native", "numpy", "numpy"]
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


@pytest.mark.parametrize("c_tok", [0.005, 0.025, 0.1])
def test_native_plan_equals_the_numpy_reference_over_steps(c_tok):
    """plan() through ``controller_plan`` (tail probabilities, their storage per slot between recomputations, the
    shrink, the weights and the gate in one call) against the numpy path, over a drifting batch: requests join and
    leave, some steps recompute and others renormalise the stored probabilities."""
    rng = np.random.default_rng(int(c_tok * 1000) + 7)
    rows = same = replans = same_caps = drafted_rows = 0
    for trial in range(6):
        cfg = dict(c_tok_ms=c_tok, draft_row_us=float(rng.choice([0.0, 20.0])), replan_steps=4, always_plan_rows=4,
                   tail_prior_weight=float(rng.choice([0.0, 0.25])), draft_margin=float(rng.choice([0.0, 0.5])),
                   tau_uncertainty=[0.0, 1.0, 2.5][trial % 3])
        ref, nat = _pair(trial, **cfg)
        assert nat._native_kernel("controller_plan") is not None and ref._native_kernel("controller_plan") is None
        problems = int(rng.integers(1, 12))
        for key in range(problems):
            lengths = rng.integers(5, 800, int(rng.integers(1, 20))).tolist()
            ref.observe(key, lengths)
            nat.observe(key, lengths)
        live = {s: int(rng.integers(0, problems + 2)) for s in range(int(rng.integers(2, 80)))}
        out = {s: int(rng.integers(0, 300)) for s in live}
        for step in range(30):
            if step % 7 == 6:  # some requests end, a new one joins
                for s in list(live)[: max(1, len(live) // 10)]:
                    del live[s]
                new = max(live, default=-1) + 1
                live[new], out[new] = int(rng.integers(0, problems + 2)), 0
            if not live:
                break
            slots = np.array(sorted(live), np.int64)
            keys = np.array([live[s] for s in slots], np.int64)
            for s in slots:
                out[s] += int(rng.integers(1, 4))
            out_len = np.array([out[s] for s in slots], np.int32)
            rounds = (out_len // 2).astype(np.int64)
            caps = rng.integers(0, 17, len(slots)).astype(np.int32)
            q = rng.random(len(slots)) * 0.95
            max_out = None if trial % 3 == 0 else np.full(len(slots), 800, np.int64)
            send = None if trial % 2 else rng.random(len(slots))
            got = [c.plan(keys, out_len, rounds, max_out, caps, q, slots, send) for c in (ref, nat)]
            assert got[0].replanned == got[1].replanned
            replans += got[0].replanned
            np.testing.assert_allclose(got[1].weight_ms, got[0].weight_ms, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(nat.last_tail_prob, ref.last_tail_prob, rtol=1e-9, atol=1e-12)
            rows += len(slots)
            same += int((got[0].draft == got[1].draft).sum())
            both = got[0].draft & got[1].draft  # the per-row draft caps agree where both drafted
            same_caps += int((got[0].budget[both] == got[1].budget[both]).sum())
            drafted_rows += int(both.sum())
        np.testing.assert_allclose(nat.last_expected_remaining, ref.last_expected_remaining, rtol=1e-12)
        assert nat.last_expected_makespan == pytest.approx(ref.last_expected_makespan, rel=1e-12)
        for key in ("steps", "rows", "replans", "silent_steps"):
            assert nat.stats()[key] == ref.stats()[key], key
    assert 0 < replans < rows
    # Only a near-tie of the gate's inequality may go the other way (pow's rounding); none did in development.
    assert same >= 0.999 * rows, (same, rows)
    assert drafted_rows > 0 and same_caps >= 0.999 * drafted_rows, (same_caps, drafted_rows)


def test_rows_seen_kernel_equals_the_numpy_reference():
    """``controller_rows_seen`` (quiet_step's check) against its numpy reference in BudgetController, on random slot
    sets: slots past the epoch array or at an older epoch make it False, as a negative slot does (numpy would wrap)."""
    rows_seen = native.load().controller_rows_seen
    ref = BudgetController(ControllerConfig(cost_source="config", backend="python"))
    rng = np.random.default_rng(5)
    answers = set()
    for trial in range(300):
        m = int(rng.integers(1, 64))
        epoch = int(rng.integers(0, 4))
        slot_epoch = np.where(rng.random(m) < 0.95, epoch, rng.integers(0, epoch + 1, m)).astype(np.int64)
        slots = rng.choice(m + (trial % 3 == 0), size=int(rng.integers(1, m + 1)), replace=False).astype(np.int64)
        ref._slot_epoch, ref._epoch = slot_epoch, epoch
        got = rows_seen(slots, slot_epoch, epoch)
        assert got is ref._all_rows_seen(slots)
        answers.add(got)
    assert answers == {True, False}
    assert rows_seen(np.array([0, -1], np.int64), np.zeros(4, np.int64), 0) is False
    assert rows_seen(np.zeros(0, np.int64), np.zeros(4, np.int64), 3) is True


def test_quiet_step_skips_the_plan_only_for_rows_the_plan_saw():
    """Both backends: after a silent plan, a quiet step of the same rows (another array) skips the plan, one with a
    row the plan did not see does not."""
    for backend in ("python", "native"):
        ctl = BudgetController(ControllerConfig(cost_source="config", backend=backend, always_plan_rows=0,
                                                c_tok_ms=5.0))  # verification far too dear: nothing pays
        ctl.observe(1, [500, 600])
        n = 8
        slots = np.arange(n, dtype=np.int64)
        plan = ctl.plan(np.full(n, 1), np.full(n, 10), slots=slots)
        assert plan.drafted == 0
        assert ctl.quiet_step(slots.copy())
        assert not ctl.quiet_step(np.append(slots[:-1], 9))  # slot 9: never planned


def test_plan_kernel_rejects_bad_slots_and_shapes():
    kernel = native.load().controller_plan
    n = 3
    f64, i64 = np.zeros(0), np.zeros(0, np.int64)
    args = lambda slots, slot_p, replan=False, caps=np.ones(n, np.int32): (  # noqa: E731
        np.ones(n), f64, f64, caps, np.full(n, 0.5), replan, np.zeros((0, 1)), f64, np.full((4, 1, 8), 0.5), slots,
        slot_p, np.zeros(len(slot_p), np.int64), 1, f64, f64, {}, np.empty(n, bool), np.empty(n), np.empty(n),
        np.empty(n), np.empty(n, np.int32))
    with pytest.raises(ValueError, match=r"slot 5 outside \[0, 4\)"):
        kernel(*args(np.array([0, 1, 5]), np.zeros(4)))
    with pytest.raises(ValueError, match="without slots every step must replan"):
        kernel(*args(i64, np.zeros(4)))
    with pytest.raises(ValueError, match="caps has 2 rows but out_len has 3"):
        kernel(*args(np.array([0, 1, 2]), np.zeros(4), caps=np.ones(2, np.int32)))
    makespan, drafted, tails = kernel(*args(np.array([0, 1, 2]), np.array([0.2, 0.3, 0.5, 0.0])))
    assert np.isnan(makespan) and tails == 0 and 0 <= drafted <= n


def test_plan_kernel_bins_samples_by_log1p_even_where_log_of_1_plus_x_differs(monkeypatch):
    """The tail kernel bins each sample by log1p(rounds) but computes the cheaper log(1 + rounds) first, falling back
    where the bin could differ: with half the samples where the two land in different bins (found by search next to
    the bin edges), its tail probabilities equal tail_probability's with the C library's log1p (numpy's own log1p
    rounds differently on some of them)."""
    import math

    from das_trl.budget.tail import tail_probability

    top_rounds, bins = 5000.0, 64
    scale = bins / math.log1p(top_rounds)
    straddle = []
    for g in range(1, bins):
        edge = math.expm1(g / scale)
        for k in range(-20000, 20000):
            r = edge + k * math.ulp(edge)
            if r >= 1.0 and min(int(math.log(1.0 + r) * scale), bins - 1) != min(int(math.log1p(r) * scale), bins - 1):
                straddle.append(r)
                break
    if not straddle:
        pytest.skip("this libm's log(1 + x) and log1p agree on every bin edge")
    rng = np.random.default_rng(0)
    n, s = 12, 16
    rounds = np.concatenate([rng.choice(straddle, (n, s // 2)), 1.0 + 3000.0 * rng.random((n, s // 2))], axis=1)
    rounds = np.sort(rounds, axis=1)
    rounds[0, -1] = top_rounds
    f64 = np.zeros(0)
    draws = np.zeros((4, 1, s))
    draws[0, 0] = (np.arange(s) + 0.5) / s  # sample t of row i: rounds[i, t] (generated 0, no jitter, tau 1)
    p = np.empty(n)
    native.load().controller_plan(
        np.zeros(n), f64, f64, np.zeros(n, np.int32), np.full(n, 0.5), True, rounds, f64, draws, np.arange(n),
        np.zeros(n), np.zeros(n, np.int64), 1, f64, f64,
        {"tail_prior_weight": 0.0, "length_jitter": 0.0, "pooled_weight": 0.0}, np.empty(n, bool), np.empty(n), p,
        np.empty(n), np.empty(n, np.int32))
    monkeypatch.setattr(np, "log1p", np.vectorize(math.log1p, otypes=[np.float64]))
    expect, _ = tail_probability(rounds, bins)
    np.testing.assert_allclose(p, expect, rtol=1e-12, atol=1e-15)


def test_plan_kernel_outputs_must_be_the_callers_buffers_and_inputs_numbers():
    """An output of another dtype or layout would be converted into a temporary and the result lost: rejected."""
    kernel = native.load().controller_plan
    n = 4
    f64 = np.zeros(0)
    base = dict(out_len=np.arange(n) * 10.0, rounds=f64, max_output=f64, caps=np.full(n, 8, np.int32),
                q=np.full(n, 0.9), replan=True, table=np.tile(np.linspace(50, 400, 8), (n, 1)),
                pooled=np.linspace(50, 400, 40), draws=np.full((4, 1, 8), 0.5), slots=np.arange(n),
                slot_p=np.zeros(8), slot_epoch=np.full(8, -1, np.int64), epoch=1, tau_z=np.zeros(0),
                send=np.zeros(0), params={},
                draft=np.zeros(n, bool), weight=np.empty(n), p=np.empty(n), rem_mean=np.empty(n),
                budget=np.zeros(n, np.int32))
    for name, bad in (("draft", np.zeros(2 * n, bool)[::2]), ("draft", np.zeros(n, np.int8)),
                      ("p", np.empty(n, np.float32)), ("slot_epoch", np.full(8, -1, np.int32)),
                      ("budget", np.zeros(n, np.int64))):
        with pytest.raises(TypeError):
            kernel(**{**base, name: bad})
    with pytest.raises(ValueError, match="row 2 has out_len nan"):
        kernel(**{**base, "out_len": np.array([0.0, 1.0, np.nan, 3.0])})
    _, drafted, _ = kernel(**base)
    assert drafted == int(base["draft"].sum()) > 0  # written in place
    assert ((base["budget"] > 0) == base["draft"]).all() and base["budget"].max() <= 8


@pytest.mark.parametrize("backend", ["native", "python"])
def test_plan_rejects_bad_input_before_changing_anything(backend):
    ctl = BudgetController(ControllerConfig(cost_source="config", backend=backend))
    ctl.observe(0, [100, 200, 300])
    ctl.observe_acceptance(10.0, 5)
    ratio = ctl.acceptance_ratio
    keys = np.zeros(3, np.int64)
    for kwargs in (dict(slots=np.array([0, 1, -1])), dict(output_len=np.array([1.0, np.nan, 2.0])),
                   dict(max_output=np.array([50.0, -1.0, 50.0])), dict(slots=np.array([0.0, 1.7, 2.0])),
                   dict(slots=np.array([0.0, np.nan, 2.0])), dict(slots=np.array([4, 1, 4])),
                   dict(acceptance=np.array([0.5, np.nan, 0.5])), dict(acceptance=np.array([0.5, 1.5, 0.5])),
                   dict(acceptance=np.array([-0.1, 0.5, 0.5])), dict(send=np.array([0.5, np.nan, 0.5])),
                   dict(send=np.array([0.5, 1.01, 0.5])), dict(num_rounds=np.array([1.0, np.nan, 1.0])),
                   dict(num_rounds=np.array([1, -4, 1])), dict(slots=np.array([0, 1, 1 << 23]))):
        args = dict(problem_keys=keys, output_len=np.array([1, 2, 3]), slots=np.arange(3))
        args.update(kwargs)
        with pytest.raises(ValueError):
            ctl.plan(**args)
    assert ctl.acceptance_ratio == ratio and ctl.stats()["steps"] == 0
    # whole-number float slots are slots; the same plan as with integers
    as_float = ctl.plan(keys, np.array([1, 2, 3]), slots=np.array([0.0, 1.0, 2.0]), acceptance=np.full(3, 0.9))
    as_int = ctl.plan(keys, np.array([1, 2, 3]), slots=np.arange(3), acceptance=np.full(3, 0.9))
    assert (as_float.draft == as_int.draft).all() and np.allclose(as_float.weight_ms, as_int.weight_ms)
    # caps of any integer dtype, huge ones included, agree with the default (MAX_CAP)
    big = ctl.plan(keys, np.array([1, 2, 3]), caps=np.full(3, 2**40, np.int64), acceptance=np.full(3, 0.9))
    u64 = ctl.plan(keys, np.array([1, 2, 3]), caps=np.full(3, 2**63, np.uint64), acceptance=np.full(3, 0.9))
    std = ctl.plan(keys, np.array([1, 2, 3]), caps=np.full(3, 64, np.int32), acceptance=np.full(3, 0.9))
    assert (big.draft == std.draft).all() and (u64.draft == std.draft).all()
    assert (big.budget == std.budget).all() and (u64.budget == std.budget).all()


def test_kernel_scratch_is_kept_per_thread_bounded_and_reported():
    """The kernels keep their per-row arrays between calls (allocated per call, glibc gave them back to the system
    and faulted them in again each time): they grow to the largest batch planned and no further, are reported by
    ``controller_scratch_bytes``, and a thread's are freed when it exits. Results stay the reference's."""
    import threading
    import time

    def plan_on(ctl, n, seed):
        rng = np.random.default_rng(seed)
        keys = rng.integers(0, 6, n)
        out_len = rng.integers(0, 900, n)
        return ctl.plan(keys, out_len, out_len // 2, np.full(n, 1024), None, np.full(n, 0.6))

    ref, nat = _pair(0)
    for key in range(6):
        ref.observe(key, [100 + 50 * key, 400, 800])
        nat.observe(key, [100 + 50 * key, 400, 800])
    before = native.load().controller_scratch_bytes()
    for n, seed in [(300, 1), (40, 2), (300, 3), (120, 4)]:  # smaller batches after larger: stale scratch contents
        a, b = plan_on(ref, n, seed), plan_on(nat, n, seed)
        np.testing.assert_array_equal(a.draft, b.draft)
        np.testing.assert_allclose(nat.last_tail_prob, ref.last_tail_prob, rtol=1e-9, atol=1e-12)
    grown = native.load().controller_scratch_bytes()
    samples = ControllerConfig().num_samples
    assert grown >= before and grown - before <= 300 * (samples * 40 + 64 * 20) + 64 * 1024  # one thread's, bounded
    for seed in range(5):
        plan_on(nat, 300, seed)
    assert native.load().controller_scratch_bytes() == grown  # the same batch size again: nothing new

    seen = []
    worker = threading.Thread(
        target=lambda: (plan_on(nat, 500, 9), seen.append(native.load().controller_scratch_bytes())))
    worker.start()
    worker.join()
    assert seen[0] > grown  # the other thread's own arrays, counted while it lived
    # ... and given back when it exited: its thread_local destructor runs when the OS thread ends, which can be just
    # after join() returns (Python releases join once the thread's state is gone), so wait for it, boundedly.
    deadline = time.monotonic() + 10.0
    while native.load().controller_scratch_bytes() != grown and time.monotonic() < deadline:
        time.sleep(0.01)
    assert native.load().controller_scratch_bytes() == grown
