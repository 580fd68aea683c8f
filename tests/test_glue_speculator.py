"""The Speculator's per-step glue: the drafter's private pre-checked entry (``step_slots(..., _prechecked=True)``),
the cached constant arrays, and that the checks it skips in the drafter still happen once, in ``Speculator.step``."""

import pickle

import numpy as np
import pytest

from das_trl.budget import BudgetController
from das_trl.drafter import DrafterConfig, create_drafter, native
from das_trl.drafter import drafter as drafter_mod
from das_trl.drafter.draft_batch import DraftBatch
from das_trl.drafter.tokens import int32_array
from das_trl.vllm import speculator as speculator_mod

pytestmark = pytest.mark.skipif(not native.available(), reason="the native core is not built")

K = 8
PHRASE = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]


def _drafter():
    d = create_drafter(DrafterConfig(max_spec_tokens=K, backend="native", background_ingest=False))
    d.add_rollouts([[1, 2, 3]] * 2, [PHRASE * 4] * 2)  # a history to draft from
    return d


def _rows(n, length, prompt=3):
    """Row arrays of ``n`` requests whose texts are ``prompt`` prompt tokens then the phrase, ``length`` in all."""
    matrix = np.zeros((n, 200), np.int32)
    for r in range(n):
        matrix[r, :prompt] = [1, 2, 3]
        matrix[r, prompt:length] = (PHRASE * 20)[:length - prompt]
    return matrix, np.arange(n, dtype=np.int32), np.full(n, length, np.int32), np.full(n, prompt, np.int32)


def test_prechecked_step_slots_equals_the_validated_call():
    """The Speculator's entry gives the same drafts and drafter state as the public, validating call."""
    outs = []
    for pre in (False, True):
        d = _drafter()
        for r in ("a", "b", "c"):
            d.start_request(r, [1, 2, 3])
        slots = np.array([d.slot_of(r) for r in ("a", "b", "c")], np.int32)
        matrix, rows, ntok, nprompt = _rows(3, 9)
        budgets = np.array([K, 0, 3], np.int32)
        out = DraftBatch.empty(3, K)
        d.step_slots(slots, matrix, rows, ntok, nprompt, np.full(3, 6, np.int32), np.full(3, -1, np.int32), budgets,
                     out, True, _prechecked=pre)
        outs.append((out, d.stats()))
    (a, sa), (b, sb) = outs
    assert a.lengths.tolist() == b.lengths.tolist() and a.lengths[0] > 0 and a.lengths[1] == 0 and a.lengths[2] <= 3
    for name in ("tokens", "accept", "source", "match_len"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert sa["draft_tokens"] == sb["draft_tokens"] and sa["proposals"] == sb["proposals"] == 2


def test_prechecked_call_still_fails_cleanly_on_wrong_lengths():
    """What the pre-checked entry trusts, the binding still checks: a wrong length or out width is a ValueError
    before any state changes (the next good call drafts as if it never happened); the matrix is still converted."""
    d = _drafter()
    d.start_request("a", [1, 2, 3])
    slots = np.array([d.slot_of("a")], np.int32)
    matrix, rows, ntok, nprompt = _rows(1, 9)
    one, out = np.ones(1, np.int32), DraftBatch.empty(1, K)
    with pytest.raises(ValueError, match="num_prompt"):
        d.step_slots(slots, matrix, rows, ntok, np.zeros(2, np.int32), one, -one, one * K, out, _prechecked=True)
    with pytest.raises(ValueError, match="max_spec_tokens"):
        d.step_slots(slots, matrix, rows, ntok, nprompt, one, -one, one * K, DraftBatch.empty(1, K + 1),
                     _prechecked=True)
    with pytest.raises(ValueError, match="2-D"):
        d.step_slots(slots, matrix[0], rows, ntok, nprompt, one, -one, one * K, out, _prechecked=True)
    assert d.stats()["proposals"] == 0
    d.step_slots(slots, matrix.astype(np.int64), rows, ntok, nprompt, one * 6, -one, one * K, out, _prechecked=True)
    assert out.lengths[0] > 0 and d.stats()["proposals"] == 1


def test_speculator_validates_once_and_the_drafter_not_again(monkeypatch):
    """Speculator.step converts its arrays itself and calls the drafter's pre-checked entry: the drafter runs no
    int32_array of its own (before, it validated the same arrays a second time every step)."""
    calls = []
    real = drafter_mod.int32_array
    monkeypatch.setattr(drafter_mod, "int32_array", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    spec = speculator_mod.Speculator(_drafter(), BudgetController(), 200)
    for r in ("a", "b"):
        spec.start(r, [1, 2, 3])
    matrix, rows, ntok, nprompt = _rows(2, 9)
    # int64 / list inputs are converted by the Speculator, once
    out = spec.step(["a", "b"], matrix, rows.astype(np.int64), ntok.tolist(), nprompt, np.full(2, 6, np.int64))
    spec.step(["a", "b"], matrix, rows, ntok + 1, nprompt, np.ones(2, np.int32), num_verified=np.zeros(2, np.int32))
    assert calls == [] and len(out) == 2 and spec.counters["steps"] == 2


def test_bad_inputs_raise_in_the_speculator_before_any_record_changes():
    """The checks the drafter no longer repeats still happen in Speculator.step, before anything changes: wrong
    lengths of any array (num_verified too), values that do not fit int32, a 1-D token matrix."""
    spec = speculator_mod.Speculator(_drafter(), BudgetController(), 200)
    for r in ("a", "b"):
        spec.start(r, [1, 2, 3])
    matrix, rows, ntok, nprompt = _rows(2, 9)
    two = np.ones(2, np.int32)
    before = spec.book.records()
    for args, kw, err in [((rows, ntok, nprompt, two), dict(num_verified=np.ones(3, np.int32)), "num_verified"),
                          ((rows, ntok, nprompt[:1], two), {}, "num_prompt"),
                          ((rows, np.array([9, 2**40]), nprompt, two), {}, "fit in int32")]:
        with pytest.raises(ValueError, match=err):
            spec.step(["a", "b"], matrix, *args, **kw)
    assert all(np.array_equal(before[k], v) for k, v in spec.book.records().items())
    assert spec.counters["steps"] == 0
    with pytest.raises(ValueError, match="2-D"):
        spec.step(["a", "b"], matrix[0], rows, ntok, nprompt, two)


def test_constant_arrays_are_reused_read_only_and_keep_their_values():
    """num_verified=None and budgets of 0 come from read-only buffers kept across steps (the same view while the
    batch size holds, new views when it changes), so no step can change what the next one reads."""
    spec = speculator_mod.Speculator(_drafter(), BudgetController(), 200)
    a = spec._filled(-1, 3)
    assert a.tolist() == [-1] * 3 and not a.flags.writeable and spec._filled(-1, 3) is a
    with pytest.raises(ValueError):
        a[0] = 5
    b = spec._filled(-1, 200)  # grows past the first buffer
    assert b.tolist() == [-1] * 200 and spec._filled(0, 2).tolist() == [0, 0]
    assert spec._filled(-1, 3) is not a and spec._filled(-1, 3).tolist() == [-1] * 3


def test_batch_size_changes_resize_the_output_views():
    """The reused output views follow the batch size both ways (3, 1, then 3 rows), each step's drafts equal to
    those of a Speculator that saw only that batch size."""
    spec = speculator_mod.Speculator(_drafter(), BudgetController(), 200)
    for r in ("a", "b", "c"):
        spec.start(r, [1, 2, 3])
    matrix, rows, ntok, nprompt = _rows(3, 9)
    lens = []
    for ids in (["a", "b", "c"], ["b"], ["a", "b", "c"]):
        n = len(ids)
        sel = np.array(["abc".index(i) for i in ids], np.int32)
        out = spec.step(ids, matrix, rows[sel], ntok[sel], nprompt[sel], np.ones(n, np.int32))
        assert len(out) == n and out.tokens.shape == (n, K)
        lens.append(out.lengths.copy())
        ntok[sel] += 1
    assert [len(x) for x in lens] == [3, 1, 3]


def test_int32_array_fast_and_general_paths_agree():
    """int32_array returns canonical int32 arrays as they are, one of an equal dtype that is not the canonical
    object without a copy, converts the rest, and checks the length on every path."""
    a = np.arange(4, dtype=np.int32)
    assert int32_array(a, "x", 4) is a
    odd = np.arange(4, dtype=np.dtype(np.int32, metadata={"k": 1}))  # == int32, another dtype object
    assert odd.dtype == np.int32 and odd.dtype is not np.dtype(np.int32)
    got = int32_array(odd, "x", 4)  # the general path, as before: a view, no copy
    assert np.shares_memory(got, odd) and got.tolist() == [0, 1, 2, 3]
    for other in (np.arange(4, dtype=">i4"), np.arange(8, dtype=np.int32)[::2] // 2, [0, 1, 2, 3],
                  pickle.loads(pickle.dumps(np.arange(4, dtype=np.int64)))):
        got = int32_array(other, "x", 4)
        assert got.dtype == np.int32 and got.flags.c_contiguous and got.tolist() == [0, 1, 2, 3]
    for bad in (a, odd, [0, 1]):
        with pytest.raises(ValueError, match="one entry per row"):
            int32_array(bad, "x", 3)


def test_int32_array_rejects_floats_that_are_not_whole_numbers():
    assert int32_array(np.array([1.0, 2.0, -3.0]), "x").tolist() == [1, 2, -3]
    for bad in (np.array([1.0, np.nan]), np.array([9.7]), np.array([np.inf, 1.0])):
        with pytest.raises(ValueError, match="x must hold integers"):
            int32_array(bad, "x")


@pytest.mark.parametrize("source", ["config", "measured"])
def test_speculator_times_its_steps_for_the_gate_only_when_asked(source):
    """draft_row_source="measured": every Speculator.step (quiet ones too) reports its rows, drafted rows and CPU to
    the controller's fit; with the configured price (default) no step is timed."""
    from das_trl.budget import ControllerConfig

    ctl = BudgetController(ControllerConfig(draft_row_source=source))
    spec = speculator_mod.Speculator(_drafter(), ctl, 200)
    for r in ("a", "b"):
        spec.start(r, [1, 2, 3])
    for length in range(6, 16):
        matrix, rows, ntok, nprompt = _rows(2, length)
        spec.step(["a", "b"], matrix, rows, ntok, nprompt, np.ones(2, np.int32))
    assert ctl.proposer_fit.stats()["steps"] == (10 if source == "measured" else 0)


@pytest.mark.parametrize("native_book", [True, False])
def test_quiet_steps_recorded_later_leave_the_book_of_a_call_per_step(native_book):
    """A quiet step of the same rows makes no call to the request book: its round and the engine-wide fading are
    recorded with the next call that needs the book (the next planned step, a start, a finish, ``book``). The book
    then holds what one call per step gives: every row's rounds, the engine-wide record faded once per step (the
    same products), and a request started in a finished request's slot starts at round 0."""
    from das_trl.budget import ControllerConfig

    d = create_drafter(DrafterConfig(max_spec_tokens=K, backend="native", background_ingest=False))
    ctl = BudgetController(ControllerConfig(c_tok_ms=5.0, always_plan_rows=0))  # nothing pays: steps go quiet
    spec = speculator_mod.Speculator(d, ctl, 200, native_book=native_book)
    ids = ["a", "b", "c"]
    for r in ids:
        spec.start(r, [1, 2, 3])
    inner = spec.book._book if native_book else spec.book
    inner.global_hits = 100.0  # a record to fade

    def rounds():
        book = spec.book  # records the pending quiet steps
        return (book.records()["rounds"] if native_book else book.rounds)[:3].tolist()

    faded = 100.0
    steps = 0
    for length in range(6, 20):
        matrix, rows, ntok, nprompt = _rows(3, length)
        spec.step(ids, matrix, rows, ntok, nprompt, np.ones(3, np.int32))
        steps += 1
        faded *= 0.99
    assert spec.counters["quiet_steps"] >= 5 and spec._quiet_run > 0  # some are not recorded yet
    assert rounds() == [steps - 1] * 3 and spec._quiet_run == 0
    assert spec.book.global_hits == faded
    spec.step(ids, matrix, rows, ntok + 1, nprompt, np.ones(3, np.int32))  # quiet again: recorded later
    assert spec._quiet_run == 1
    spec.finish("b")  # records it, before the slot is freed
    spec.start("d", [1, 2, 3])  # reuses b's slot
    ids = ["a", "d", "c"]
    matrix[1, 3:ntok[1] + 1] = matrix[0, 3:ntok[0] + 1]
    spec.step(ids, matrix, rows, ntok + 2, nprompt, np.ones(3, np.int32))
    assert rounds() == [steps + 1, 0, steps + 1]
    assert spec.book.global_hits == faded * 0.99 * 0.99


def test_step_outputs_hold_the_batch_arrays_and_refuse_converted_ones():
    """The pre-checked step writes through a StepOutputs made once per output batch (the same object while the
    Speculator's views hold, a new one for a new batch); StepOutputs refuses arrays it would have to convert (a
    copy would take the drafts), and step_into checks the held arrays' rows and width as step does."""
    d = _drafter()
    d.start_request("a", [1, 2, 3])
    slots = np.array([d.slot_of("a")], np.int32)
    matrix, rows, ntok, nprompt = _rows(1, 9)
    one, out = np.ones(1, np.int32), DraftBatch.empty(1, K)
    d.step_slots(slots, matrix, rows, ntok, nprompt, one * 6, -one, one * K, out, _prechecked=True)
    held = d._held_out[1]
    assert d._held_out[0] is out and out.lengths[0] > 0
    d.step_slots(slots, matrix, rows, ntok + 1, nprompt, one, -one, one * 0, out, _prechecked=True)
    assert d._held_out[1] is held and out.lengths[0] == 0 and not out.tokens.any()
    other = DraftBatch.empty(1, K)
    d.step_slots(slots, matrix, rows, ntok + 2, nprompt, one, -one, one * K, other, _prechecked=True)
    assert d._held_out[0] is other and d._held_out[1] is not held
    mod = native.load()
    with pytest.raises(TypeError):
        mod.StepOutputs(out.tokens, out.accept.astype(np.float32), out.lengths, out.source, out.match_len)
    wide = DraftBatch.empty(2, K)
    with pytest.raises(ValueError, match="tokens must have 1 rows"):
        d._core.step_into(matrix, slots, rows, ntok + 3, nprompt, one, -one, one,
                          mod.StepOutputs(wide.tokens, wide.accept, wide.lengths, wide.source, wide.match_len))
