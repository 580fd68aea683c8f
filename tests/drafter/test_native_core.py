"""The native core on its own: errors, concurrency, memory figures, and the build hint when it is missing."""

import threading

import numpy as np
import pytest

from das_trl.drafter import DrafterConfig, create_drafter, native
from das_trl.drafter.digest import state_digest



def make(**kw):
    return create_drafter(DrafterConfig(backend="native", **kw))


def test_bad_input_gets_clear_errors_and_changes_nothing(rng):
    d = make()
    prompt = rng.integers(0, 100, 20).tolist()
    d.start_request("a", prompt)
    with pytest.raises(ValueError, match="already active"):
        d.start_request("a", prompt)
    with pytest.raises(KeyError, match="not active"):
        d.extend_request("nope", [1, 2])
    with pytest.raises(KeyError):
        d.propose_batch(["a", "nope"], [4, 4])
    with pytest.raises(ValueError, match=r"\[0, 2\*\*31\)"):
        d.extend_request("a", [1, -3])
    with pytest.raises(ValueError, match="problem_keys"):
        d.add_rollouts([prompt], [[1, 2]], problem_keys=[-1])
    assert d.stats()["tokens"] == 0
    m = np.zeros((2, 8), np.int32)
    with pytest.raises(ValueError, match="num_tokens 9"):
        d.step(["a"], m, [0], [9], [2], [1], [-1], [4])
    core = d._core
    with pytest.raises(ValueError, match="offsets"):
        core.submit_history(5, np.arange(4, dtype=np.int32), np.array([0, 3], np.int64), np.ones(1, np.int32))
    with pytest.raises(ValueError, match="weights"):
        core.submit_history(5, np.arange(4, dtype=np.int32), np.array([0, 4], np.int64), np.ones(2, np.int32))
    with pytest.raises(ValueError, match="max_spec_tokens"):
        make(max_spec_tokens=65)
    # Read-only inputs are accepted (borrowed for the call, never written).
    ro = np.asarray(prompt, np.int32)
    ro.setflags(write=False)
    d.start_request("b", ro)
    assert d.check() == ""


def test_a_prompt_is_started_from_the_callers_int32_array_without_a_copy(rng):
    """An int32 prompt (vLLM's token row) is checked in place and copied once, by the core: a strided or negative one
    too, with the same errors as a list; the drafts do not depend on how the prompt was given."""
    from das_trl.drafter.tokens import token_view

    row = rng.integers(0, 100, 40).astype(np.int32)
    assert token_view(row, "p") is row
    assert token_view(row[::2], "p") is not None and token_view([1, 2], "p").dtype == np.int32
    with pytest.raises(ValueError, match=r"range \[-3, 9\]"):
        token_view(np.array([9, -3], np.int32), "prompt_token_ids")
    d, ref = make(), make()
    with pytest.raises(ValueError, match=r"\[0, 2\*\*31\)"):
        d.start_request("bad", np.array([4, -1], np.int32))
    assert "bad" not in d.active_requests
    d.start_request("view", row[::2])  # strided: the core's binding copies it
    ref.start_request("view", row[::2].tolist())
    row[:] = 0  # the caller reuses its buffer: the drafter kept its own copy
    for drafter in (d, ref):
        drafter.add_rollouts([rng.integers(0, 100, 20).tolist()], [list(range(30))])
        drafter.extend_request("view", [1, 2, 3])
    got, want = d.propose_batch(["view"], [8]), ref.propose_batch(["view"], [8])
    assert got.as_lists() == want.as_lists() and got.as_lists()[0]
    assert d.check() == ""


def test_missing_build_says_how_to_build(monkeypatch):
    monkeypatch.setattr(native, "_module", None)
    import builtins

    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and "_das_native" in fromlist:
            raise ImportError("No module named '_das_native'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="build_native.sh"):
        create_drafter(DrafterConfig(backend="native"))
    assert not native.available()
    d = create_drafter(DrafterConfig(backend="auto"))  # falls back to the reference, with a warning
    assert type(d).__name__ == "DASDrafter"


def test_pushes_and_proposes_from_different_threads(rng):
    """An updater thread pushes steps (background builds) while an engine thread keeps stepping 64 requests; nothing
    crashes, every push reaches the history (digest equals a serial replay of the same pushes), drafts come back."""
    d = make(window=3, history_token_budget=60_000)
    prompts = [rng.integers(0, 500, 30).astype(np.int32) for _ in range(8)]
    steps = [[(p, [rng.integers(0, 50, int(rng.integers(50, 300))) for _ in range(8)]) for p in range(8)]
             for _ in range(25)]
    errors, drafted = [], [0]
    stop = threading.Event()

    def engine():
        try:
            ids = [f"r{i}" for i in range(64)]
            for i, rid in enumerate(ids):
                d.start_request(rid, prompts[i % 8])
            while not stop.is_set():
                b = d.propose_batch(ids, np.full(64, 8))
                drafted[0] += int(b.lengths.sum())
                for j, rid in enumerate(ids):
                    d.record_acceptance(rid, 1)
                    d.extend_request(rid, rng.integers(0, 50, 2))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=engine)
    t.start()
    for step in steps:
        d.add_rollouts([prompts[p] for p, cs in step for _ in cs], [c for _, cs in step for c in cs],
                       background=True)
    assert d.wait_for_updates(60)
    stop.set()
    t.join(60)
    assert not errors, errors
    assert drafted[0] > 0
    serial = make(window=3, history_token_budget=60_000)
    for step in steps:
        serial.add_rollouts([prompts[p] for p, cs in step for _ in cs], [c for _, cs in step for c in cs])
    assert state_digest(d.state_dict()["history"]) == state_digest(serial.state_dict()["history"])
    assert d.stats()["update_errors"] == 0 and d.check() == ""
    # The automata serving drafts are those of the last push too.
    native_d, native_s = d._core.stats(), serial._core.stats()
    for key in ("index_problems", "index_tokens", "index_sequences", "index_states", "global_tokens"):
        assert native_d[key] == native_s[key], key


def test_memory_figures_are_reported(rng):
    d = make()
    prompt = rng.integers(0, 500, 30).tolist()
    d.add_rollouts([prompt] * 8, [rng.integers(0, 200, 400).tolist() for _ in range(8)])
    d.start_request("a", prompt)
    d.extend_request("a", rng.integers(0, 200, 100))
    s = d.stats()
    assert s["tokens"] == 3200 and s["index_bytes"] > 0 and s["global_bytes"] > 0
    assert 0 < s["bytes_per_history_token"] < 400
    assert s["live_bytes"] > 0 and s["live_running_tokens"] == 130


def test_the_python_side_knows_the_native_tree_depth_limit():
    # The trainer refuses das_max_tree_depth above NATIVE_MAX_TREE_DEPTH before any engine exists: it must be the
    # core's own limit, not one beside it.
    from das_trl.drafter.config import NATIVE_MAX_TREE_DEPTH

    create_drafter(DrafterConfig(backend="native", max_tree_depth=NATIVE_MAX_TREE_DEPTH))
    with pytest.raises(ValueError, match="max_tree_depth"):
        create_drafter(DrafterConfig(backend="native", max_tree_depth=NATIVE_MAX_TREE_DEPTH + 1))
