"""The native request book (src/request_book.cc) against the numpy reference (das_trl/vllm/request_book.py): the same
records, plan inputs, verification totals and cut output, bit for bit, call by call and over a whole replay."""

import functools

import numpy as np
import pytest

from das_trl.bench import drafters, simulation
from das_trl.bench.sets import RolloutRecord
from das_trl.drafter import DrafterConfig, create_drafter, native
from das_trl.drafter.draft_batch import DraftBatch
from das_trl.vllm import speculator as speculator_mod
from das_trl.vllm.request_book import NativeRequestBook, RequestBook

pytestmark = pytest.mark.skipif(not native.available(), reason="the native core is not built")

K = 8


def _books(send_rounds: float = 2.0):
    return (RequestBook(0.4, 3.0, capacity=4, send_rounds=send_rounds),
            NativeRequestBook(native.load(), 0.4, 3.0, send_rounds))


def _records(book):
    if isinstance(book, NativeRequestBook):
        return book.records()
    return {name: getattr(book, name)[: len(book.key)].copy() for name, _ in RequestBook._FIELDS}


def _same_records(ref, nat):
    a, b = _records(ref), _records(nat)
    n = len(b["key"])
    for name in a:
        assert np.array_equal(a[name][:n], b[name]), name
    assert not a["key"][n:].any()  # the reference's spare capacity is unused
    assert ref.global_hits == nat.global_hits and ref.global_misses == nat.global_misses
    assert ref.global_speculated == nat.global_speculated and ref.global_sent_steps == nat.global_sent_steps


@pytest.mark.parametrize("send_rounds", [2.0, 0.0])
def test_calls_agree_bit_for_bit_on_random_steps(send_rounds):
    """Random batches over 40 slots, 300 steps: begin / prepare / finish give the same results and records."""
    rng = np.random.default_rng(7)
    ref, nat = _books(send_rounds)
    sends = []
    for slot in range(40):
        key, max_out, dslot = int(rng.integers(0, 2**62)), int(rng.integers(1, 5000)), int(rng.integers(-1, 99))
        ref.reset(slot, key, max_out, dslot)
        nat.reset(slot, key, max_out, dslot)
    for step in range(300):
        n = int(rng.integers(0, 40))
        slots = rng.choice(40, size=n, replace=False).astype(np.int64)
        assert ref.begin(slots) == nat.begin(slots)
        num_sampled = rng.integers(1, K + 2, n).astype(np.int32)
        verified = rng.integers(-1, K + 1, n).astype(np.int32)
        num_tokens = rng.integers(10, 600, n).astype(np.int32)
        num_prompt = np.minimum(rng.integers(1, 50, n), num_tokens).astype(np.int32)
        if step % 7 == 3:
            ref.decay()
            nat.decay()
            continue
        (pa, oa), (pb, ob) = (b.prepare(slots, num_sampled, verified, num_tokens, num_prompt, 620, K)
                              for b in (ref, nat))
        assert oa == ob, step
        for x, y, name in zip(pa, pb, pa._fields):
            assert x.dtype == y.dtype and np.array_equal(x, y), (step, name)
        sends.extend(pa.send.tolist())
        planned = rng.random(n) < 0.5
        outs = []
        for _ in range(2):
            out = DraftBatch.empty(n, K)
            outs.append(out)
        lengths = np.where(planned & (rng.random(n) < 0.7), rng.integers(1, K + 1, n), 0).astype(np.int32)
        for out in outs:
            cols = np.arange(K)[None, :] < lengths[:, None]
            out.lengths[:] = lengths
            out.tokens[:] = np.where(cols, np.arange(1, K + 1)[None, :] + 100 * np.arange(n)[:, None], 0)
            out.accept[:] = np.where(cols, 0.9 ** np.arange(1, K + 1)[None, :], 0.0)
            out.source[:] = np.where(lengths > 0, 1, -1)
            out.match_len[:] = np.where(lengths > 0, 5, 0)
        drafting = np.flatnonzero(lengths)
        kept = rng.integers(-1, K + 2, len(drafting)).astype(np.int32)
        expected = rng.random(len(drafting))
        fa = ref.finish(slots, planned, drafting, kept, expected, outs[0], None)
        fb = nat.finish(slots, planned, drafting, kept, expected, outs[1], None)
        assert fa == fb, step
        for name in ("tokens", "lengths", "accept", "source", "match_len"):
            assert np.array_equal(getattr(outs[0], name), getattr(outs[1], name)), (step, name)
        _same_records(ref, nat)
    # the send rates moved (planned rows sent, were cut to nothing or found no draft), or stayed 1 when off
    assert (len(set(sends)) > 20 and 0 < min(sends) < 1) if send_rounds else set(sends) == {1.0}


def test_send_rate_falls_for_a_request_whose_drafts_are_cut_and_starts_at_the_engine_rate():
    book = RequestBook(0.5, 2.0, send_rounds=2.0)
    for slot in range(3):
        book.reset(slot, slot, 100, -1)
    slots = np.arange(3, dtype=np.int64)
    assert book.send_rate(slots).tolist() == [1.0, 1.0, 1.0]  # no evidence yet
    for _ in range(6):  # rows 0 and 1 speculated every step; only row 0's draft survives the cut
        out = DraftBatch.empty(3, K)
        out.lengths[:] = [2, 0, 0]
        book.finish(slots, np.array([True, True, False]), np.flatnonzero(out.lengths), out.lengths[:1].copy(),
                    np.ones(1), out, None)
    rate = book.send_rate(slots)
    engine = (book.global_sent_steps + 2.0) / (book.global_speculated + 2.0)
    assert rate[1] < 0.4 < engine < rate[0] <= 1.0 and rate[2] == pytest.approx(engine)  # row 2: the engine's rate


def test_bad_slots_raise_and_change_nothing():
    _, nat = _books()
    nat.reset(0, 5, 100, 0)
    before = nat.records()
    with pytest.raises(ValueError, match="unknown slot"):
        nat.begin(np.array([0, 3], np.int64))
    with pytest.raises(ValueError, match="rows"):
        nat.prepare(np.array([0], np.int64), *(np.zeros(2, np.int32) for _ in range(4)), 100, K)
    after = nat.records()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_distinct_finds_a_slot_twice_in_both_books():
    """The Speculator's check that no request is listed twice in a step: the native book's stamp pass and the
    reference agree on random slot lists, and a call does not see the stamps of the one before it."""
    ref, nat = _books()
    for slot in range(40):
        ref.reset(slot, slot, 100, slot)
        nat.reset(slot, slot, 100, slot)
    rng = np.random.default_rng(3)
    answers = set()
    for trial in range(200):
        slots = rng.choice(40, size=int(rng.integers(1, 40)), replace=bool(trial % 2)).astype(np.int64)
        got = nat.distinct(slots)
        assert got == ref.distinct(slots) == (len(set(slots.tolist())) == len(slots))
        assert nat.distinct(slots) == got  # the same list again: the stamps of the last call are not duplicates
        answers.add(got)
    assert answers == {True, False}
    for book in (ref, nat):
        with pytest.raises(ValueError):
            book.distinct(np.array([0, 400], np.int64))
        assert book.distinct(np.zeros(0, np.int64))


def test_native_book_needs_the_native_drafter():
    from das_trl.budget import BudgetController

    ref = create_drafter(DrafterConfig(max_spec_tokens=K, backend="python"))
    with pytest.raises(ValueError, match="native drafter"):
        speculator_mod.Speculator(ref, BudgetController(), 100, native_book=True)
    nat = create_drafter(DrafterConfig(max_spec_tokens=K, backend="native"))
    assert isinstance(speculator_mod.Speculator(nat, BudgetController(), 100).book, NativeRequestBook)


def _batch(rng, prompts, epoch, vocab=300):
    """Four completions per prompt: a shared phrase per prompt with mutations, so drafts are made and partly
    accepted, and lengths vary (the tail drains to a few long rows)."""
    out = []
    for p, prompt in enumerate(prompts):
        phrase = np.random.default_rng(p).integers(1, vocab, 30)
        for s in range(4):
            n = int(rng.integers(60, 400))
            tokens = np.resize(phrase, n)
            flip = rng.random(n) < 0.15
            tokens[flip] = rng.integers(1, vocab, int(flip.sum()))
            out.append(RolloutRecord.make(epoch, float(epoch), prompt, tokens.tolist(), "stop"))
    return out


def test_a_replay_is_the_same_with_the_native_and_the_reference_book(monkeypatch):
    """das+controller over a 48-request replay (drafting and silent steps, a draining tail): every step's drafts
    (tokens, lengths, acceptance estimates), the Speculator's and the controller's counters and the final records are
    the same with either book, so the native one can stand in for the reference in every figure."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 300, 16).tolist() for _ in range(12)]
    train = [_batch(rng, prompts, e) for e in range(2)]
    evals = _batch(rng, prompts, 2)
    runs = []
    for native_book in (False, True):
        monkeypatch.setattr("das_trl.bench.drafters.das_controller.Speculator",
                            functools.partial(speculator_mod.Speculator, native_book=native_book))
        d = drafters.make_drafter("das+controller", controller_config=drafters.controller_config(7.0, 0.005))
        assert isinstance(d.speculator.book, NativeRequestBook) == native_book
        steps = []
        real = d.speculator.step

        def step(*a, _real=real, _steps=steps, **kw):
            out = _real(*a, **kw)
            _steps.append((out.tokens.copy(), out.lengths.copy(), out.accept.copy()))
            return out

        d.speculator.step = step
        res = simulation.simulate(d, train, evals, 7.0, 0.005)
        runs.append((steps, dict(d.speculator.counters), d.controller.stats(), res.steps, d.speculator.book))
    (sa, ca, ka, na, ba), (sb, cb, kb, nb, bb) = runs
    assert ca == cb and ka == kb and na == nb
    assert ca["drafts"] > 50 and ca["silent_steps"] < ca["steps"]  # it did draft
    assert len(sa) == len(sb)
    for i, (x, y) in enumerate(zip(sa, sb)):
        assert all(np.array_equal(u, v) for u, v in zip(x, y)), f"step {i}"
    _same_records(ba, bb)


def test_bad_steps_raise_before_any_record_changes_and_an_empty_first_step_works():
    """An empty first step (only partial prefills) works with the native book; a step with a repeated id, an
    unknown id or arrays of the wrong length raises before the records change (a retry counts nothing twice)."""
    from das_trl.budget import BudgetController

    d = create_drafter(DrafterConfig(max_spec_tokens=K, backend="native"))
    spec = speculator_mod.Speculator(d, BudgetController(), 200)
    matrix = np.zeros((2, 200), np.int32)
    empty = np.zeros(0, np.int32)
    out = spec.step([], matrix, empty, empty, empty, empty)
    assert len(out) == 0
    spec.start("a", [1, 2, 3], max_output=np.int64(17))
    spec.start("b", [1, 2, 3])
    assert spec.book.records()["max_output"].tolist() == [17, 200]
    with pytest.raises(ValueError, match="max_output"):
        spec.start("c", [1, 2, 3], max_output=True)
    before = spec.book.records()
    one, two = np.ones(1, np.int32), np.ones(2, np.int32)
    rows, ntok, nprompt = np.arange(2, dtype=np.int32), np.full(2, 4, np.int32), np.full(2, 3, np.int32)
    for args, err in [((["a", "a"], matrix, rows, ntok, nprompt, two), "twice"),
                      ((["a", "b"], matrix, rows, ntok, nprompt, one), "one entry per row")]:
        with pytest.raises(ValueError, match=err):
            spec.step(*args)
    with pytest.raises(KeyError, match="not tracked"):
        spec.step(["a", "zz"], matrix, rows, ntok, nprompt, two)
    after = spec.book.records()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert spec.counters["steps"] == 1
    with pytest.raises(ValueError, match="max_model_len"):
        speculator_mod.Speculator(d, BudgetController(), 0)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("inf")])
def test_send_rounds_must_be_a_finite_number_at_least_zero(bad):
    with pytest.raises(ValueError, match="send_rounds"):
        RequestBook(0.5, 2.0, send_rounds=bad)
    with pytest.raises(ValueError, match="send_rounds"):
        NativeRequestBook(native.load(), 0.5, 2.0, bad)
    with pytest.raises(ValueError, match="send_rounds"):  # the core's own check
        native.load().RequestBook().set_prior(0.5, 2.0, bad)
