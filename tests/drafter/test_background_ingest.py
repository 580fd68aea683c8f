"""Steps where no row drafts: no drafting work for rows without a budget, and the deferred ingest on the native
ingest thread (``DrafterConfig.background_ingest``) changes no draft, no acceptance estimate, no source and no
counter; calls made while an ingest is in flight see the complete state; the deferred tokens are bounded by one
step's; the slot-based step API (``slot_of`` / ``step_slots``, preallocated outputs)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from das_trl.drafter import DrafterConfig, DraftBatch, create_drafter

K = 8
COUNTERS = ("proposals", "speculated_rows", "drafts", "draft_tokens", "requests", "wins", "verified_drafts",
            "accepted_tokens", "calibration_tokens", "active_requests", "sibling_groups", "lingering_finished",
            "live_running_tokens", "live_finished_tokens", "live_tree_tokens", "live_evicted_outputs",
            "live_evicted_tokens", "live_rebuilds", "live_bytes", "tokens", "appearances")


def make(background: bool, **kw):
    kw.setdefault("draft_threads", 1)
    kw.setdefault("defer_idle_rows", False)  # the identity with the synchronous path (test_defer_idle_rows: with it)
    return create_drafter(DrafterConfig(backend="native", max_spec_tokens=K, support_table_bits=12,
                                        background_ingest=background, **kw))


def same_batch(a: DraftBatch, b: DraftBatch) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "lengths", "accept", "source",
                                                                      "match_len"))


class Engine:
    """A seeded engine-like driver of several drafters with identical inputs: requests of a few problems (siblings)
    start and stop at different steps, some stop early, one is preempted (its output shrinks), all-zero-budget steps
    alternate with drafting steps, trims and partial verifications are random, finished rollouts are pushed."""

    def __init__(self, drafters, seed: int, rows: int = 12, vocab: int = 12, out_len: int = 120) -> None:
        self.d = drafters
        self.rng = np.random.default_rng(seed)
        self.vocab, self.out_len = vocab, out_len
        self.prompts = [self.rng.integers(100, 100 + vocab, int(self.rng.integers(4, 40))).tolist() for _ in range(4)]
        self.bases = [self.rng.integers(100, 100 + vocab, out_len).tolist() for _ in range(4)]
        self.width = 64 + out_len + 4
        self.matrix = np.zeros((rows, self.width), np.int32)
        self.free = list(range(rows))
        self.live: dict[str, dict] = {}  # request id -> row, problem, target, pos (output tokens emitted)
        self.last: dict[str, int] = {}  # request id -> tokens gained in its last step (verification input)
        self.verified: dict[str, int] = {}
        self.count = 0
        self.finished: list[tuple[list[int], list[int]]] = []
        self.preempted = self.restarted_in_zero_step = 0

    def start(self) -> None:
        row = self.free.pop()
        p = int(self.rng.integers(len(self.prompts)))
        target = list(self.bases[p])
        for _ in range(int(self.rng.integers(0, 12))):
            target[int(self.rng.integers(len(target)))] = int(self.rng.integers(100, 100 + self.vocab))
        rid = f"r{self.count}"
        self.count += 1
        prompt = self.prompts[p]
        self.matrix[row, :len(prompt)] = prompt
        first = int(self.rng.integers(1, 40))  # a prefill chunk of output tokens (or just the first token)
        self.matrix[row, len(prompt):len(prompt) + first] = target[:first]
        self.live[rid] = dict(row=row, problem=p, target=target, pos=first, stop_at=len(target) if
                              self.rng.random() < 0.7 else int(self.rng.integers(first + 1, len(target))))
        self.last[rid] = first
        self.verified[rid] = -1
        for d in self.d:
            d.start_request(rid, prompt)

    def step_inputs(self, ids: list[str], zero: bool):
        rows = np.array([self.live[r]["row"] for r in ids], np.int32)
        num_prompt = np.array([len(self.prompts[self.live[r]["problem"]]) for r in ids], np.int32)
        num_tokens = num_prompt + np.array([self.live[r]["pos"] for r in ids], np.int32)
        sampled = np.array([self.last[r] for r in ids], np.int32)
        verified = np.array([self.verified[r] for r in ids], np.int32)
        budgets = np.zeros(len(ids), np.int32) if zero else self.rng.integers(-1, K + 3, len(ids)).astype(np.int32)
        return rows, num_tokens, num_prompt, sampled, verified, budgets

    def run(self, steps: int, on_step) -> None:
        for _ in range(4):
            self.start()
        for step in range(steps):
            ids = list(self.live)
            zero = self.rng.random() < 0.5
            if self.live and self.rng.random() < 0.06:  # preempt one request: recomputed from a shorter output
                rid = ids[int(self.rng.integers(len(ids)))]
                st = self.live[rid]
                st["pos"] = int(self.rng.integers(1, st["pos"] + 1))
                self.last[rid] = 1
                self.preempted += 1
                self.restarted_in_zero_step += zero
            args = self.step_inputs(ids, zero)
            batches = on_step(step, ids, self.matrix, args)
            b = batches[0]
            sent = b.lengths.copy()
            if len(ids) and self.rng.random() < 0.3:
                sent = np.minimum(sent, self.rng.integers(0, K + 1, len(ids))).astype(np.int32)
                for d in self.d:
                    d.trim(ids, sent)
            for j, rid in enumerate(ids):
                st = self.live[rid]
                draft = b.row(j)[: int(sent[j])]
                t, p = st["target"], st["pos"]
                usable = min(len(draft), len(t) - p - 1)
                acc = 0
                while acc < usable and draft[acc] == t[p + acc]:
                    acc += 1
                emit = t[p:p + acc + 1]
                row = st["row"]
                n_prompt = len(self.prompts[st["problem"]])
                self.matrix[row, n_prompt + p:n_prompt + p + len(emit)] = emit
                st["pos"] += len(emit)
                self.last[rid] = len(emit)
                self.verified[rid] = int(self.rng.integers(0, len(draft) + 1)) if draft and self.rng.random() < 0.2 \
                    else -1
            for rid in ids:  # finished (or stopped early): the stop comes right after the step
                st = self.live[rid]
                if st["pos"] >= st["stop_at"]:
                    for d in self.d:
                        d.stop_request(rid)
                    self.finished.append((self.prompts[st["problem"]], st["target"][:st["pos"]]))
                    self.free.append(st["row"])
                    del self.live[rid]
            while self.free and (len(self.live) < 3 or self.rng.random() < 0.15):
                self.start()
            if len(self.finished) >= 8 and self.rng.random() < 0.1:  # a history push
                ps, cs = zip(*self.finished)
                for d in self.d:
                    d.add_rollouts(list(ps), list(cs))
                self.finished.clear()


@pytest.mark.parametrize("seed,hold", [(0, False), (1, False), (2, True), (3, True)])
def test_background_ingest_changes_nothing(seed, hold):
    """Background ingest on (slot API, one preallocated output reused every step) and off (request ids, a new
    output each step): identical drafts, accept arrays, sources, match lengths at every step, identical counters,
    and a consistent core throughout. ``hold``: the ingest thread is held, so every deferred step is completed by
    the next call that needs it (stop, start, trim, propose_batch, stats, check, add_rollouts, the next step), the
    path a caller takes when it comes before the thread."""
    bg, sync = make(True), make(False)
    bg._core.hold_ingest(hold)
    buf = DraftBatch.empty(64, K)
    seen = dict(zero=0, drafting=0, zero_rows_drafted=0)

    def on_step(step, ids, matrix, args):
        n = len(ids)
        out = DraftBatch(buf.tokens[:n], buf.lengths[:n], buf.accept[:n], buf.source[:n], buf.match_len[:n])
        buf.tokens[:n] = 7  # stale content from "an earlier step": rows without a draft must read as no draft
        buf.accept[:n] = 0.5
        slots = np.array([bg.slot_of(r) for r in ids], np.int32)
        a = bg.step_slots(slots, matrix, *args, out=out)
        b = sync.step(ids, matrix, *args)
        assert a is out
        assert same_batch(a, b), f"step {step}: drafts differ"
        idle = args[-1] <= 0
        assert not a.lengths[idle].any() and (a.source[idle] == -1).all() and not a.tokens[idle].any() \
            and not a.accept[idle].any()
        seen["zero" if not (args[-1] > 0).any() else "drafting"] += 1
        if step % 7 == 0:  # with the previous step's ingest possibly still in flight
            assert bg.check() == "" and sync.check() == ""
        if step % 11 == 0:
            sa, sb = bg.stats(), sync.stats()
            assert {k: sa[k] for k in COUNTERS} == {k: sb[k] for k in COUNTERS}, f"step {step}"
        if step % 13 == 5 and ids:  # a propose_batch between engine steps (completes a deferred ingest first)
            budgets = np.full(n, K)
            assert same_batch(bg.propose_batch(ids, budgets), sync.propose_batch(ids, budgets))
        return [a, b]

    eng = Engine([bg, sync], seed)
    eng.run(200, on_step)
    assert seen["zero"] > 40 and seen["drafting"] > 40
    assert eng.preempted >= 3 and eng.count > 20
    sa, sb = bg.stats(), sync.stats()
    assert {k: sa[k] for k in COUNTERS} == {k: sb[k] for k in COUNTERS}
    assert sa["deferred_steps"] > 30 and sb["deferred_steps"] == 0
    if hold:  # the callers ingested it all; steps where nothing drafts queue behind each other without waiting
        assert 0 < sa["ingest_caller_steps"] < sa["deferred_steps"] and sa["ingest_background_seconds"] == 0.0
    assert sa["drafts"] > 50  # the drafters did draft (siblings and own text repeat)
    assert bg.check() == "" and sync.check() == ""


@pytest.mark.parametrize("seed", [0, 4])
def test_defer_idle_rows_is_deterministic_and_loses_no_token(seed):
    """defer_idle_rows (the default): drafting steps leave the rows without a budget to the ingest thread. Two
    drafters (thread at work / held, so the next call ingests) draft identically at every step; against the
    synchronous path most drafts agree (only the other rows' newest tokens arrive a step later); more steps defer;
    every token is ingested in the end (same live token counts), and the cores stay consistent."""
    a, b, sync = make(True, defer_idle_rows=True), make(True, defer_idle_rows=True), make(False)
    b._core.hold_ingest(True)
    silent_only = make(True)  # defers only the steps where no row drafts
    agree = [0, 0]

    def on_step(step, ids, matrix, args):
        slots = np.array([a.slot_of(r) for r in ids], np.int32)
        x = a.step_slots(slots, matrix, *args)
        y = b.step(ids, matrix, *args)
        z = sync.step(ids, matrix, *args)
        silent_only.step(ids, matrix, *args)
        assert same_batch(x, y), f"step {step}: deferred drafts depend on who ingests"
        drafting = args[-1] > 0
        if drafting.any() and not drafting.all():
            agree[0] += int((x.lengths[drafting] == z.lengths[drafting]).sum())
            agree[1] += int(drafting.sum())
        return [x, y, z]

    eng = Engine([a, b, sync, silent_only], seed)
    eng.run(200, on_step)
    assert agree[1] > 100 and agree[0] >= 0.8 * agree[1], agree
    sa, sb, sc = a.stats(), b.stats(), sync.stats()
    # the drafting steps with idle rows deferred too
    assert sa["deferred_steps"] == sb["deferred_steps"] >= silent_only.stats()["deferred_steps"] + 30
    assert sc["deferred_steps"] == 0
    for key in ("live_running_tokens", "live_finished_tokens", "live_tree_tokens"):
        assert sa[key] == sb[key] == sc[key], key
    assert a.check() == "" and b.check() == "" and sync.check() == ""


@pytest.mark.parametrize("seed", [0, 4])
def test_drafts_never_read_a_half_appended_automaton(seed):
    """defer_shared_ingest: the ingest thread is slowed down (it sleeps before each queued row while it holds the
    drafter's lock, as it holds it while ingesting), so engine steps arrive in the middle of its ingest. Their drafts
    equal, at every step, those of a drafter whose thread is held (each step completes the queue itself before it
    drafts): a draft that read an automaton the thread had appended to only in part would differ."""
    slow, held = make(True, defer_shared_ingest=True), make(True, defer_shared_ingest=True)
    slow._core.set_ingest_delay(300)
    held._core.hold_ingest(True)

    def on_step(step, ids, matrix, args):
        time.sleep(0.002)  # the engine's forward pass: the thread starts its (slow) ingest of the last step
        x = slow.step(ids, matrix, *args)
        y = held.step(ids, matrix, *args)
        assert same_batch(x, y), f"step {step}: a draft read a different automaton"
        return [x, y]

    eng = Engine([slow, held], seed)
    eng.run(120, on_step)
    sa, sb = slow.stats(), held.stats()
    assert sa["ingest_waits"] > 0  # steps did arrive while the thread was ingesting (~20-60 of them here)
    assert sa["drafts"] == sb["drafts"] > 30 and sb["ingest_background_seconds"] == 0.0
    for key in ("live_running_tokens", "live_finished_tokens", "live_tree_tokens"):
        assert sa[key] == sb[key], key
    assert slow.check() == "" and held.check() == ""


@pytest.mark.parametrize("hold", [False, True])
def test_calls_while_ingest_in_flight(hold):
    """Large deferred steps (hundreds of tokens per row) followed at once by stop (its siblings must see its whole
    text), start, extend, trim, record_acceptance, propose_batch and stats: the same results as without deferral,
    whether the ingest thread is at work (it holds the drafter's lock: the call waits) or has not started (held:
    the call ingests)."""
    rng = np.random.default_rng(5)
    bg, sync = make(True), make(False)
    bg._core.hold_ingest(hold)
    prompt = rng.integers(0, 50, 16).tolist()
    base = rng.integers(0, 50, 4000)
    texts = []
    for i in range(16):
        t = base.copy()
        t[rng.integers(0, len(t), 40)] = rng.integers(0, 50, 40)
        texts.append(t)
    matrix = np.zeros((16, 16 + 4000), np.int32)
    matrix[:, :16] = prompt
    for i in range(16):
        matrix[i, 16:] = texts[i]
    ids = [f"q{i}" for i in range(16)]
    for d in (bg, sync):
        for r in ids:
            d.start_request(r, prompt, problem_key=7)
    pos = np.zeros(16, np.int32)
    rows = np.arange(16, dtype=np.int32)
    zero = np.zeros(16, np.int32)
    for rnd in range(6):
        gained = rng.integers(200, 600, 16).astype(np.int32)
        pos += gained
        args = (matrix, rows, 16 + pos, np.full(16, 16, np.int32), gained, np.full(16, -1, np.int32), zero)
        a = bg.step(ids, *args)
        b = sync.step(ids, *args)
        assert same_batch(a, b)
        victim = ids[rnd]
        # Right after the deferred step: the ingest thread is likely at work on ~6k tokens.
        for d in (bg, sync):
            d.stop_request(victim)
        new = f"n{rnd}"
        for d in (bg, sync):
            d.start_request(new, prompt, problem_key=7)
            d.extend_request(new, texts[rnd][:int(pos[rnd])])
        survivors = ids[rnd + 1:] + [new]
        budgets = np.full(len(survivors), K)
        assert same_batch(bg.propose_batch(survivors, budgets), sync.propose_batch(survivors, budgets))
        for d in (bg, sync):
            d.trim(survivors[:2], [1, 0])
            d.record_acceptance(survivors[0], 1, 1)
        sa, sb = bg.stats(), sync.stats()
        assert {k: sa[k] for k in COUNTERS} == {k: sb[k] for k in COUNTERS}
        for d in (bg, sync):
            d.stop_request(new)
        ids[rnd] = f"x{rnd}"  # the stopped request's row is restarted as a new request
        for d in (bg, sync):
            d.start_request(ids[rnd], prompt, problem_key=7)
        pos[rnd] = 0
    assert bg.stats()["deferred_steps"] == 6
    assert bg.check() == "" and sync.check() == ""


def started_batch(d, rng, n: int, out_len: int):
    """``n`` requests started on ``d`` with one 10-token prompt; their matrix rows hold it and ``out_len`` random
    output tokens. Returns ``(ids, prompt, matrix, rows)``."""
    ids = [f"b{i}" for i in range(n)]
    prompt = rng.integers(0, 40, 10).tolist()
    for r in ids:
        d.start_request(r, prompt)
    matrix = np.zeros((n, 10 + out_len), np.int32)
    matrix[:, :10] = prompt
    matrix[:, 10:] = rng.integers(0, 40, (n, out_len))
    return ids, prompt, matrix, np.arange(n, dtype=np.int32)


def test_quiet_steps_queue_without_waiting_and_drafting_steps_complete_the_queue():
    """Steps where no row drafts (and starts) queue their tokens behind whatever earlier steps left, without
    completing it; the queue holds exactly what was queued since it was last completed; a drafting step completes
    it all before it drafts (and, without defer_idle_rows, leaves nothing queued); once the thread is free, it
    drains the queue on its own."""
    rng = np.random.default_rng(9)
    d = make(True)
    d._core.hold_ingest(True)  # the thread takes nothing: what is queued stays until a caller needs the state
    n = 32
    ids, prompt, matrix, rows = started_batch(d, rng, n, 3000)
    pos = np.zeros(n, np.int32)
    deferred = 0
    waiting = n * len(prompt)  # the started requests' prompts are queued too
    for step in range(42):  # the last two queue for the thread
        gained = rng.integers(1, 60, n).astype(np.int32)
        pos += gained
        drafting = step % 5 == 4
        budgets = np.full(n, K if drafting else 0, np.int32)
        d.step(ids, matrix, rows, 10 + pos, np.full(n, 10, np.int32), gained, np.full(n, -1, np.int32), budgets)
        waiting = 0 if drafting else waiting + int(gained.sum())
        assert d._core.ingest_queued_tokens() == waiting, step  # read without completing anything
        deferred += not drafting
    d._core.hold_ingest(False)
    for _ in range(200):  # the thread drains it on its own
        if d._core.ingest_queued_tokens() == 0:
            break
        time.sleep(0.01)
    assert d._core.ingest_queued_tokens() == 0
    s = d.stats()
    assert s["deferred_steps"] == deferred
    assert s["ingest_caller_steps"] == 8  # the drafting steps
    assert s["speculated_rows"] == s["proposals"] == 8 * n  # only the rows of drafting steps were speculated
    assert s["ingest_background_seconds"] >= s["ingest_last_seconds"] > 0.0
    assert s["ingest_background_cpu_seconds"] >= 0.0
    assert s["live_tree_tokens"] > 0 and d.check() == ""


@pytest.mark.parametrize("defer_idle_rows", [True, False])
def test_a_new_batchs_first_drafting_step_builds_only_its_drafting_requests(defer_idle_rows):
    """Requests started since the last step wait for that step (out of the ingest thread's reach). A drafting step
    with defer_idle_rows builds the drafting ones' automata now and queues the idle ones' prompts for the thread
    (the first step of a new batch drafts a few rows: building all was its cost); without it, it builds all. The
    drafting row drafts from its own prompt either way, as a synchronous drafter does; the idle prompts arrive."""
    d, sync = make(True, defer_idle_rows=defer_idle_rows), make(False)
    d._core.hold_ingest(True)  # what is queued stays queued until a caller needs the state
    n, pattern = 8, [5, 6, 7, 8, 9, 10, 11]
    prompts = [pattern * 6] + [list(range(100 + 40 * i, 130 + 40 * i)) for i in range(1, n)]
    ids = [f"n{i}" for i in range(n)]
    width = max(map(len, prompts)) + 1
    matrix = np.zeros((n, width), np.int32)
    for i, (rid, prompt) in enumerate(zip(ids, prompts)):
        matrix[i, :len(prompt)] = prompt
        matrix[i, len(prompt)] = pattern[len(prompt) % len(pattern)]  # the first output token continues the pattern
        for x in (d, sync):
            x.start_request(rid, prompt)
    assert d._core.ingest_queued_tokens() == sum(map(len, prompts))  # a start costs a copy
    num_prompt = np.array([len(p) for p in prompts], np.int32)
    args = (matrix, np.arange(n, dtype=np.int32), num_prompt + 1, num_prompt, np.ones(n, np.int32),
            np.full(n, -1, np.int32), np.array([K] + [0] * (n - 1), np.int32))
    out, want = d.step(ids, *args), sync.step(ids, *args)
    idle_tokens = sum(len(p) + 1 for p in prompts[1:])  # the idle rows' prompts and first tokens
    assert d._core.ingest_queued_tokens() == (idle_tokens if defer_idle_rows else 0)
    assert out.row(0) == want.row(0) and len(out.row(0)) >= 4
    assert out.row(0)[:4] == [pattern[(len(prompts[0]) + 1 + j) % len(pattern)] for j in range(4)]
    assert not out.lengths[1:].any()
    d._core.hold_ingest(False)
    for x in (d, sync):
        x.stop_request(ids[0])  # a stop completes the queue: every prompt reached the live pool
    assert d.stats()["live_running_tokens"] == sync.stats()["live_running_tokens"] == idle_tokens
    assert d.check() == "" and sync.check() == ""


def test_zero_budget_rows_do_no_drafting_work():
    """Rows with budget <= 0 in a drafting step: no draft, not counted as speculated, their verification still
    recorded; a reused output's stale rows are cleared."""
    rng = np.random.default_rng(3)
    d = make(True)
    seq = rng.integers(0, 5, 400)  # repetitive: every row can draft from its own text
    ids = ["a", "b", "c", "d"]
    for r in ids:
        d.start_request(r, seq[:8].tolist())
    matrix = np.tile(seq.astype(np.int32), (4, 1))
    rows = np.arange(4, dtype=np.int32)
    num = np.full(4, 300, np.int32)
    out = DraftBatch.empty(4, K)
    out.tokens[:] = 3
    out.accept[:] = 0.9
    out.source[:] = 2
    out.match_len[:] = 5
    budgets = np.array([K, 0, -1, 2], np.int32)
    slots = np.array([d.slot_of(r) for r in ids], np.int32)
    d.step_slots(slots, matrix, rows, num, np.full(4, 8, np.int32), np.full(4, 292, np.int32),
                 np.full(4, -1, np.int32), budgets, out=out)
    assert out.lengths[0] > 0 and 0 < out.lengths[3] <= 2
    for i in (1, 2):
        assert out.lengths[i] == 0 and out.source[i] == -1 and out.match_len[i] == 0
        assert not out.tokens[i].any() and not out.accept[i].any()
    assert not out.tokens[3, 2:].any() and not out.accept[3, 2:].any()
    assert d.stats()["speculated_rows"] == 2
    # The next step verifies rows 0 and 3 only (rows without a draft have nothing outstanding).
    d.step_slots(slots, matrix, rows, num + 1, np.full(4, 8, np.int32), np.ones(4, np.int32),
                 np.full(4, -1, np.int32), np.zeros(4, np.int32))
    assert d.stats()["verified_drafts"] == 2


def test_step_slots_errors_and_slot_of():
    d = make(True)
    d.start_request("a", [1, 2, 3, 4])
    slot = d.slot_of("a")
    assert isinstance(slot, int)
    with pytest.raises(KeyError, match="not active"):
        d.slot_of("zz")
    m = np.zeros((2, 16), np.int32)
    m[0, :5] = [1, 2, 3, 4, 5]
    one = np.ones(1, np.int32)
    with pytest.raises(KeyError):
        d.step_slots(np.array([slot + 5], np.int32), m, [0], [5], [4], one, [-1], [4])
    with pytest.raises(ValueError, match="rows"):
        d.step_slots(np.array([slot], np.int32), m, [0, 1], [5], [4], one, [-1], [4])
    with pytest.raises(ValueError, match="out.accept"):
        bad = DraftBatch.empty(1, K)
        bad.accept = np.zeros((1, K), np.float32)
        d.step_slots(np.array([slot], np.int32), m, [0], [5], [4], one, [-1], [4], out=bad)
    with pytest.raises(ValueError, match="out.tokens"):
        d.step_slots(np.array([slot], np.int32), m, [0], [5], [4], one, [-1], [4], out=DraftBatch.empty(2, K))
    with pytest.raises(ValueError, match="int32"):
        d.step_slots(np.array([slot], np.int32), m, [0], np.array([2**40]), [4], one, [-1], [4])
    # Nothing changed by the refused calls; the good call works with int64 inputs and a huge budget.
    b = d.step_slots(np.array([slot], np.int64), m, [0], [5], [4], one, [-1], np.array([2**40]))
    assert len(b) == 1 and d.check() == ""
    assert d.step(["a"], m, [0], [5], [4], [0], [-1], [0]).lengths.tolist() == [0]


def test_config_field():
    with pytest.raises(ValueError, match="background_ingest"):
        DrafterConfig(background_ingest=1)
    with pytest.raises(ValueError, match="defer_idle_rows"):
        DrafterConfig(defer_idle_rows="yes")
    d = make(False)
    assert d.stats()["deferred_steps"] == 0


def test_trim_after_an_unreleased_step_does_not_ingest_and_release_hands_it_to_the_thread():
    """step_slots(release=False) (the Speculator's drafting steps): the idle rows' tokens stay queued, the trim that
    follows touches only the outstanding drafts (it neither waits for nor does the ingest), and release_ingest
    offers them to the thread."""
    rng = np.random.default_rng(2)
    d = make(True, defer_idle_rows=True)
    n = 8
    ids = [f"t{i}" for i in range(n)]
    seq = rng.integers(0, 6, 600).astype(np.int32)  # repetitive: the drafting rows find drafts
    for r in ids:
        d.start_request(r, seq[:8].tolist(), problem_key=1)
    d.wait_for_ingest()  # the prompts (queued by start) in the automata: this call ingests them (caller ingest 1)
    matrix = np.tile(seq, (n, 1))
    slots = np.array([d.slot_of(r) for r in ids], np.int32)
    args = (matrix, np.arange(n, dtype=np.int32), np.full(n, 300, np.int32), np.full(n, 8, np.int32),
            np.full(n, 292, np.int32), np.full(n, -1, np.int32))
    budgets = np.array([K, K] + [0] * (n - 2), np.int32)
    out = d.step_slots(slots, *args, budgets, release=False)
    assert out.lengths[:2].all() and not out.lengths[2:].any()
    d.trim(ids[:2], [1, 0])
    core = d._core.stats()  # reads the queue first, then completes it (a caller ingest)
    assert core["ingest_queued_tokens"] == 6 * 292 and core["caller_ingests"] == 1  # step and trim left them queued
    assert d._core.stats()["caller_ingests"] == 2
    # the next step: released, the thread ingests them (no caller ingest)
    args = args[:2] + (np.full(n, 301, np.int32), args[3], np.ones(n, np.int32), args[5])
    d.step_slots(slots, *args, budgets, release=False)
    d.trim(ids[:1], [0])
    d.release_ingest()
    time.sleep(0.5)  # the thread wakes at once; only a caller arriving before it would ingest itself
    d.wait_for_ingest()
    s = d.stats()
    assert s["ingest_queued_tokens"] == 0 and s["ingest_caller_steps"] == 2 and s["deferred_steps"] == 2
    assert s["drafts"] == 2 and d.check() == ""


def test_quiet_steps_in_quick_succession_wake_the_thread_at_most_once():
    """The ingest thread polls for queued tokens for a while after its last ingest (a wake-up costs the engine's
    thread a system call per step): steps that follow each other within that window offer their tokens without
    waking it, and the thread still ingests every one of them itself (no caller ingest). After a pause longer than
    the window it parks, and the next offer wakes it. Offers that a caller ingests first keep it polling as well."""
    rng = np.random.default_rng(4)
    d = make(True)
    n = 16
    ids, prompt, matrix, rows = started_batch(d, rng, n, 400)

    def quiet(step: int) -> None:
        d.step(ids, matrix, rows, np.full(n, 10 + step, np.int32), np.full(n, 10, np.int32), np.ones(n, np.int32),
               np.full(n, -1, np.int32), np.zeros(n, np.int32))
        for _ in range(500):  # the thread takes them on its own (within its poll interval)
            if d._core.ingest_queued_tokens() == 0:
                return
            time.sleep(0.001)
        raise AssertionError(f"step {step}: the ingest thread left the tokens queued")

    quiet(1)  # the thread may be parked before the first offer (it polled since its start): at most one wake-up
    first = d.stats()["ingest_wakeups"]
    assert first <= 1
    for step in range(2, 40):
        quiet(step)
    s = d.stats()
    assert s["ingest_wakeups"] == first  # none of these 38 steps woke it
    assert s["ingest_caller_steps"] == 0 and s["deferred_steps"] == 39
    assert s["ingest_thread_cpu_seconds"] >= s["ingest_background_cpu_seconds"] > 0.0
    time.sleep(0.3)  # longer than the poll window: the thread parks
    quiet(40)
    assert d.stats()["ingest_wakeups"] == first + 1
    # Steps whose tokens a caller ingests before the thread looks (a benchmark's flush) keep it polling too: 0.2 s
    # of them, twice the poll window, wake it no more.
    for step in range(41, 81):
        d.step(ids, matrix, rows, np.full(n, 10 + step, np.int32), np.full(n, 10, np.int32), np.ones(n, np.int32),
               np.full(n, -1, np.int32), np.zeros(n, np.int32))
        d.wait_for_ingest()
        time.sleep(0.005)
    s = d.stats()
    assert s["ingest_wakeups"] == first + 1 and s["ingest_caller_steps"] >= 30
    assert d.check() == ""


def test_trim_slots_equals_trim_by_id():
    """trim_slots (the Speculator's trim, by slot) leaves the same counters as trim by request id; a bad slot raises
    and changes nothing."""
    rng = np.random.default_rng(4)
    n = 6
    seq = rng.integers(0, 6, 400).astype(np.int32)
    ids = [f"s{i}" for i in range(n)]
    drafters = [make(True), make(True)]
    for d in drafters:
        for r in ids:
            d.start_request(r, seq[:8].tolist(), problem_key=3)
    matrix = np.tile(seq, (n, 1))
    args = (matrix, np.arange(n, dtype=np.int32), np.full(n, 200, np.int32), np.full(n, 8, np.int32),
            np.full(n, 192, np.int32), np.full(n, -1, np.int32), np.full(n, K, np.int32))
    outs = [d.step(ids, *args) for d in drafters]
    assert np.array_equal(outs[0].lengths, outs[1].lengths) and outs[0].lengths.all()
    keep = np.array([0, 1, 2, 0, 3, 50])
    drafters[0].trim(ids, keep)
    a = drafters[1]
    with pytest.raises(KeyError):
        a.trim_slots(np.array([a.slot_of(ids[1]), 999], np.int32), np.array([0, 0]))
    assert a.stats()["drafts"] == n  # nothing trimmed
    a.trim_slots(np.array([a.slot_of(r) for r in ids], np.int32), keep)
    s0, s1 = drafters[0].stats(), a.stats()
    assert s0["drafts"] == s1["drafts"] == n - 2 and s0["draft_tokens"] == s1["draft_tokens"]


def test_the_first_step_benchmark_runs_the_real_drafter():
    """``scripts/bench_first_step.py`` (the figure docs/native-core.md quotes) starts requests and steps the native
    drafter itself: a change to those calls breaks it here, not silently."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_first_step.py"
    spec = importlib.util.spec_from_file_location("bench_first_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    us_per_start, first_step_ms = module.first_step(16, 20, 2, 1)
    assert 0.0 < us_per_start < 1e5 and 0.0 < first_step_ms < 1e4
