"""Background history updates: same trees as a synchronous push, applied in push order, and ``propose`` keeps
answering while a large step is being inserted (the engine's critical path is not blocked for the whole step)."""

import time

import numpy as np

from drafter_utils import make_drafter


def _step(rng, problems=6, samples=4, length=400):
    prompts, comps = [], []
    for _ in range(problems):
        p = rng.integers(1000, 30000, 30).tolist()
        for _ in range(samples):
            prompts.append(p)
            comps.append(rng.integers(1000, 30000, length).tolist())
    return prompts, comps


def test_background_push_equals_synchronous_push(rng):
    steps = [_step(rng) for _ in range(3)]
    sync, bg = make_drafter(window=2), make_drafter(window=2)  # window 2: the third push evicts
    for prompts, comps in steps:
        sync.add_rollouts(prompts, comps)
        out = bg.add_rollouts(prompts, comps, background=True)
        assert out["queued"] and out["sequences"] == len(comps)
        assert bg.stats()["tokens"] == sync.stats()["tokens"]  # the history itself is updated at once
    assert bg.wait_for_updates(timeout=60)
    a, b = sync.stats(), bg.stats()
    for key in ("problems", "appearances", "tokens", "evicted_appearances", "problem_trees", "global_seqs"):
        assert a[key] == b[key], key
    assert b["pending_updates"] == 0 and b["update_errors"] == 0
    prompts, comps = steps[-1]
    for d in (sync, bg):
        d.start_request("r", prompts[0])
    ctx = prompts[0] + comps[0][:40]
    assert bg.propose("r", ctx, 8) == sync.propose("r", ctx, 8) == comps[0][40:48]


def test_propose_is_served_while_a_large_step_is_inserted(rng):
    d = make_drafter()
    prompts, comps = _step(rng, problems=40, samples=8, length=500)  # 160k tokens
    d.start_request("live", prompts[0])
    ctx = np.asarray(prompts[0], dtype=np.int32)
    latencies = []
    d.add_rollouts(prompts, comps, background=True)
    while d.stats()["pending_updates"]:
        t0 = time.perf_counter()
        d.propose("live", ctx, 8)
        latencies.append(time.perf_counter() - t0)
    assert d.wait_for_updates(timeout=60)
    # Many proposals were answered during the update (a blocking push would allow at most one).
    assert len(latencies) >= 5, latencies
    assert d.stats()["appearances"] == 40


def test_synchronous_push_waits_for_queued_background_pushes(rng):
    d = make_drafter(window=1)
    (p1, c1), (p2, c2) = _step(rng, problems=1), _step(rng, problems=1)
    p2 = p1[: len(p2)]  # same problem both times
    d.add_rollouts(p1, c1, background=True)
    d.add_rollouts(p2, c2)  # must land after the queued push: window 1 keeps this one
    d.start_request("r", p1[0])
    assert d.propose("r", p1[0] + c2[0][:30], 8) == c2[0][30:38]
    assert d.stats()["evicted_appearances"] == 1
