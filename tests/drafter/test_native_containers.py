"""The native core's containers and the live automata built on them at sizes where their large-table paths run:
hash tables that double incrementally into mapped pages, arrays that grow by mremap (flat_map.h, pod_vector.h;
why: benchmarks/NOTES.md, "Two long proposer calls at 256 x 16k"), and the history snapshots' memory layout."""

import numpy as np
import pytest

from das_trl.drafter import DrafterConfig, create_drafter


def test_containers_agree_with_the_standard_library():
    from das_trl.drafter.native import _das_native

    # 300k operations: tables of up to 16 MiB (mapped, several incremental doublings), arrays of 3.6 MB (mremap).
    for seed, n in ((1, 1), (2, 1000), (3, 300_000)):
        assert _das_native.selftest_containers(seed, n) == ""
    with pytest.raises(ValueError, match="2\\*\\*27"):
        _das_native.selftest_containers(1, 10**12)  # would exhaust the machine's memory


def test_history_snapshots_lay_out_best_continuations_in_order():
    # A draft walks each matched state's most frequent continuation, state after state; the snapshot lays those
    # chains out in memory order (snapshot.cc, step 3), so the walk reads the next state instead of a far one. The
    # drafts themselves do not depend on it (test_native_equivalence.py compares them with the reference).
    from das_trl.drafter.native import _das_native

    for seed, n in ((1, 1), (2, 30), (3, 600)):
        err, share = _das_native.selftest_snapshot_layout(seed, n)
        assert err == ""
        assert share > 0.6, share  # most continuations are the very next state (0.87-0.90 at these sizes)
    with pytest.raises(ValueError, match="4096"):
        _das_native.selftest_snapshot_layout(1, 5000)


def test_step_rejects_negative_token_ids_and_changes_nothing():
    # -1 is "no transition" inside the automata: a negative id in the engine's token matrix corrupted them (found
    # by a fresh helper: check() failed, then a crash); extend_request already rejected it.
    d = create_drafter(DrafterConfig(backend="native"))
    d.start_request("a", [5, 6, 7])
    m = np.array([[5, 6, 7, 1, -1, 2, 0, 0]], np.int32)
    with pytest.raises(ValueError, match="token id -1 at position 4"):
        d.step(["a"], m, [0], [6], [3], [3], [-1], [4])
    assert d.stats()["live_running_tokens"] == 3 and d.check() == ""
    m[0, 4] = 3
    d.step(["a"], m, [0], [6], [3], [3], [-1], [4])
    assert d.stats()["live_running_tokens"] == 6 and d.check() == ""


def test_large_live_automata_stay_consistent_and_draft_across_requests():
    rng = np.random.default_rng(0)
    d = create_drafter(DrafterConfig(backend="native", prompt_tail_tokens=4000, use_local_tree=False))
    prompts = [rng.integers(0, 30_000, 2000).tolist() for _ in range(48)]  # 96k tokens in the running batch
    for i, p in enumerate(prompts):
        d.start_request(f"r{i}", p)
    for i in range(48):  # outputs grow past the prompts (appends into the grown tables)
        d.extend_request(f"r{i}", rng.integers(0, 30_000, 200).tolist())
    # A request whose output so far repeats a stretch of another's prompt drafts that prompt's continuation from
    # the running batch's automaton.
    d.start_request("copy", rng.integers(0, 30_000, 10).tolist())
    d.extend_request("copy", prompts[17][1000:1030])
    d.wait_for_ingest()
    batch = d.propose_batch(["copy"], [16])
    assert batch.row(0) == prompts[17][1030:1046]
    s = d.stats()
    assert s["live_bytes"] > 8 * 2**20, s["live_bytes"]  # the batch automaton's arrays and table are mapped
    assert d.check() == ""
