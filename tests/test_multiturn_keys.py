"""Multi-turn and tool-calling rollouts keep their problem's history.

In TRL's tool-calling GRPO a later turn is a new engine request whose prompt is the first prompt + earlier turns +
tool output; its problem key must be the conversation's (first prompt's, or the das_problem_id the trainer pushed), so
it drafts from that problem's history. Fast: real DASWorkerExtension + DASProposer + DASDrafter behind a fake model
runner (``reliability_fakes``).
"""

from __future__ import annotations

import numpy as np
import pytest

from reliability_fakes import K, FakeWorker
from das_trl.drafter import problem_key
from das_trl.drafter.conversation import ConversationKeys
from das_trl.trainer.callback import DASHistoryMirror
from das_trl.trainer.problem_ids import problem_id_key, problem_ids_of


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _conversation(rng):
    """First prompt, and a pushed multi-turn completion: turn 1, tool output, turn 2."""
    prompt = rng.integers(10, 900, 16).tolist()
    turn1, tool, turn2 = (rng.integers(10, 900, n).tolist() for n in (40, 12, 60))
    return prompt, turn1, tool, turn2


def _second_turn_round(worker, prompt, turn1, tool, turn2, n_out=4, extra_args=None):
    """Start the second-turn request (prompt = first prompt + turn 1 + tool output) and return its draft after n_out
    output tokens."""
    runner = worker.model_runner
    second = prompt + turn1 + tool
    runner.set_rows([("turn2", second, turn2[:n_out])], extra_args)
    return runner.step([[turn2[n_out - 1]]])[0]


def test_second_turn_request_drafts_from_its_problems_history(rng):
    worker = FakeWorker()
    assert worker.das_attach("")["ok"]
    prompt, turn1, tool, turn2 = _conversation(rng)
    other = rng.integers(10, 900, 16).tolist()
    # Last step's rollouts: 4 samples of the conversation (TRL pushes first prompt -> whole multi-turn completion).
    worker.proposer.add_history([prompt] * 4 + [other] * 4, [turn1 + tool + turn2] * 4
                                + [rng.integers(10, 900, 100).tolist()] * 4, background=False)
    draft = _second_turn_round(worker, prompt, turn1, tool, turn2)
    drafter = worker.proposer.drafter
    assert drafter.problem_of("turn2") == problem_key(prompt)  # the conversation's problem, not its own prompt's hash
    assert draft == turn2[4:4 + K]
    assert drafter.stats()["wins"]["problem"] == 1  # drafted from the problem's history tree


def test_first_turn_registered_live_keys_later_turns_before_any_push(rng):
    worker = FakeWorker()
    assert worker.das_attach("")["ok"]
    prompt, turn1, tool, turn2 = _conversation(rng)
    runner = worker.model_runner
    runner.set_rows([("turn1", prompt, turn1[:3])])
    runner.step([[turn1[2]]])
    _second_turn_round(worker, prompt, turn1, tool, turn2)
    assert worker.proposer.drafter.problem_of("turn2") == problem_key(prompt)


def test_explicit_problem_id_pushed_by_the_trainer_keys_every_turn(rng):
    worker = FakeWorker()
    assert worker.das_attach("")["ok"]
    prompt, turn1, tool, turn2 = _conversation(rng)
    key = problem_id_key("gsm8k:train:17")
    worker.proposer.add_history([prompt] * 4, [turn1 + tool + turn2] * 4, problem_keys=[key] * 4, background=False)
    runner = worker.model_runner
    runner.set_rows([("first", prompt, turn1[:3])])
    runner.step([[turn1[2]]])
    assert worker.proposer.drafter.problem_of("first") == key
    draft = _second_turn_round(worker, prompt, turn1, tool, turn2)
    assert worker.proposer.drafter.problem_of("turn2") == key
    assert draft and draft == turn2[4:4 + len(draft)]  # (the length policy sets the budget)
    # An id sent with the request (SamplingParams.extra_args["das_problem_id"]) wins over everything.
    _second_turn_round(worker, prompt, turn1, tool, turn2, extra_args={"das_problem_id": 5})
    assert worker.proposer.drafter.problem_of("turn2") == key  # already started: the key is fixed at start
    runner.set_rows([("explicit", prompt, turn1[:3])], {"das_problem_id": 5})
    runner.step([[turn1[2]]])
    assert worker.proposer.drafter.problem_of("explicit") == 5


def test_conversation_keys_longest_prefix_and_bound():
    keys = ConversationKeys(max_prompts=2)
    a = np.array([1, 2, 3])
    keys.register(a, 10)
    keys.register(np.array([1, 2, 3, 4, 5]), 20)
    assert keys.resolve(np.array([1, 2, 3, 4, 5, 6])) == 20  # the longest registered prefix
    assert keys.resolve(np.array([1, 2, 3, 9])) == 10
    assert keys.resolve(a) == 10
    assert keys.resolve(np.array([1, 2])) is None and keys.resolve(np.array([], np.int64)) is None
    keys.register(np.array([7, 7]), 30)  # third prompt: the least recently used one (the 5-token prompt) goes
    assert len(keys) == 2 and keys.stats()["conversation_prompts"] == 2
    assert keys.stats()["conversation_prompts_evicted"] == 1
    assert keys.resolve(np.array([1, 2, 3, 4, 5, 6])) == 10
    keys.register(a, 11)  # re-registering replaces the key
    assert keys.resolve(a) == 11 and len(keys) == 2
    long = np.arange(3000) % 977
    keys.register(long, 40)
    assert keys.resolve(np.concatenate([long, [5]])) == 40
    with pytest.raises(ValueError, match="max_prompts"):
        ConversationKeys(max_prompts=0)


def test_conversation_keys_memo_resolves_as_the_full_resolution():
    """The sibling memo returns exactly what a memo-less resolver does, under registrations of longer prefixes,
    re-keyed prompts, evictions (LRU order included) and a full memo; and it is used."""
    rng = np.random.default_rng(0)
    stems = [rng.integers(0, 50, int(rng.integers(1, 6))) for _ in range(12)]

    def prompt():
        base = stems[int(rng.integers(len(stems)))]
        tail = rng.integers(0, 3, int(rng.integers(0, 3)))
        return np.concatenate([base, tail]).astype(np.int32 if rng.random() < 0.5 else np.int64)

    memo, plain = ConversationKeys(max_prompts=6, max_memo=5), ConversationKeys(max_prompts=6, max_memo=0)
    hashed = [0]
    full = memo._prefix_hashes
    memo._prefix_hashes = lambda p: (hashed.__setitem__(0, hashed[0] + 1), full(p))[1]
    hits = 0
    for i in range(4000):
        p = prompt()
        if rng.random() < 0.15:
            key = int(rng.integers(0, 4))
            memo.register(p, key)
            plain.register(p, key)
        else:
            before = hashed[0]
            assert memo.resolve(p) == plain.resolve(p), i
            hits += hashed[0] == before and len(memo) > 0  # resolved without the prefix hashes
        assert list(memo._entries.items()) == list(plain._entries.items())
        assert memo.stats()["conversation_memo"] <= 5
    assert hits > 20 and plain.stats()["conversation_memo"] == 0
    hashed[0] = 0
    group = np.array([3, 1, 4, 1, 5], np.int32)
    memo.register(group, 77)
    assert [memo.resolve(group.copy()) for _ in range(8)] == [77] * 8 and hashed[0] == 1  # the register only
    stats = memo.stats()
    assert stats["conversation_memo_bytes"] >= stats["conversation_memo"]
    with pytest.raises(ValueError, match="max_memo"):
        ConversationKeys(max_memo=-1)
    with pytest.raises(ValueError, match="max_memo_bytes"):
        ConversationKeys(max_memo_bytes=-1)
    small = ConversationKeys(max_memo_bytes=40)  # 10 int32 tokens
    small.register(np.arange(8, dtype=np.int32), 1)  # remembered (32 bytes)
    assert small.resolve(np.arange(9, dtype=np.int32)) == 1 and small.stats()["conversation_memo_bytes"] <= 40
    small.resolve(np.arange(20, dtype=np.int32))  # 80 bytes: resolved, not remembered
    assert small.stats()["conversation_memo_bytes"] <= 40


def test_problem_id_column_values():
    assert problem_id_key(7) == 7 and problem_id_key(np.int64(7)) == 7
    assert problem_id_key("a") == problem_id_key("a") != problem_id_key("b")
    for bad in (-1, 2**63, 1.5, True, None, ""):
        with pytest.raises(ValueError, match="das_problem_id"):
            problem_id_key(bad)
    assert problem_ids_of([{"prompt": "x"}]) is None
    assert problem_ids_of([{"das_problem_id": 3}, {"das_problem_id": "q"}]) == [3, problem_id_key("q")]
    with pytest.raises(ValueError, match="missing in 1 of 2"):
        problem_ids_of([{"das_problem_id": 3}, {"prompt": "y"}])


def test_mirror_records_explicit_keys_like_the_engine(rng):
    from das_trl.drafter.digest import history_digest

    worker = FakeWorker()
    assert worker.das_attach("")["ok"]
    prompt, turn1, tool, turn2 = _conversation(rng)
    mirror = DASHistoryMirror(16, 10**6)
    keys = [problem_id_key(3)] * 2
    mirror.record([prompt] * 2, [turn1, turn2], keys)
    worker.proposer.add_history([prompt] * 2, [turn1, turn2], problem_keys=keys, background=False)
    assert mirror.history.problems() == [3]
    assert history_digest(worker.proposer.drafter._history) == mirror.digest()
    with pytest.raises(ValueError, match="problem keys"):
        mirror.record([prompt], [turn1], [1, 2])


def test_trainer_pushes_das_problem_id_keys_to_engine_and_mirror(rng, tmp_path):
    from test_reliability_history import _engine, _trainer

    engine = _engine()
    trainer = _trainer(engine, tmp_path)
    prompt_a, prompt_b = rng.integers(10, 900, 16).tolist(), rng.integers(10, 900, 16).tolist()
    completions = [rng.integers(10, 900, 30).tolist() for _ in range(4)]
    # Two prompts of one dataset problem (e.g. augmented wording) share the id: one history problem.
    keys = problem_ids_of([{"das_problem_id": "p1"}] * 4)
    trainer._das_pending.append(([prompt_a, prompt_a, prompt_b, prompt_b], completions, keys))
    trainer.das_push_history()
    drafter = engine.workers[0].proposer.drafter
    assert drafter.history_problems() == [problem_id_key("p1")]
    assert trainer._das_mirror.history.problems() == [problem_id_key("p1")]
    assert engine.history_digests() == [trainer._das_mirror.digest()]
    assert trainer._metrics["train"]["das/history_repairs"] == [0.0]
