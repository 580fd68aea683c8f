"""The default (das+controller) on converged and unconverged replays: long drafts for the rows that set the
makespan, none where nothing pays, and never more tokens in a step than the engine schedules."""

import numpy as np
import pytest

from das_trl.bench import drafters, sets, simulation
from das_trl.drafter import DrafterConfig
from das_trl.drafter.rollout_log import RolloutRecord
from das_trl.vllm.engine import DEFAULT_NUM_SPECULATIVE_TOKENS


def _converged(epochs=4, problems=4, samples=4, length=160, vocab=5000, changes=0):
    """Each problem's completions repeat one template (a converged policy), ``changes`` tokens perturbed per sample."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, vocab, 24).tolist() for _ in range(problems)]
    templates = [rng.integers(1, vocab, length - 10 * p).tolist() for p in range(problems)]
    out = {}
    for e in range(epochs):
        r = np.random.default_rng(100 + e)
        recs = []
        for p, t in zip(prompts, templates):
            for _ in range(samples):
                c = list(t)
                for j in r.choice(len(c), size=changes, replace=False):
                    c[j] = int(r.integers(1, vocab))
                recs.append(RolloutRecord.make(e, float(e), p, c, "stop"))
        out[e] = recs
    return out


def _replay(epochs, drafter):
    train, evals, _, _ = sets.split_epochs(epochs, None, None)
    return simulation.simulate(drafter, train, evals, 7.0, 0.025)


def test_converged_replay_drafts_past_16_tokens_for_its_tail_rows():
    assert DEFAULT_NUM_SPECULATIVE_TOKENS > 16 and DrafterConfig().max_spec_tokens == DEFAULT_NUM_SPECULATIVE_TOKENS
    res = _replay(_converged(), drafters.make_drafter("das+controller"))
    per_position = res.reliability["per_position"]["tokens"]
    assert sum(per_position[16:]) > 0, "no draft token past position 16"
    assert res.tokens_per_round > 12


def test_step_never_offers_more_than_the_engine_schedules():
    epochs = _converged()
    free = _replay(epochs, drafters.make_drafter("das+controller"))
    cap = 40
    assert max(free.step_tokens) > cap  # uncapped, some step verifies more: the cap below binds
    d = drafters.make_drafter("das+controller")
    d.speculator.max_step_tokens = cap
    capped = _replay(epochs, d)
    assert max(capped.step_tokens) <= cap
    assert capped.counters["capped_steps"] > 0 and capped.tokens == free.tokens


def test_bad_step_cap_is_refused():
    from das_trl.budget import BudgetController
    from das_trl.drafter import create_drafter
    from das_trl.vllm.speculator import Speculator

    with pytest.raises(ValueError, match="max_step_tokens"):
        Speculator(create_drafter(DrafterConfig()), BudgetController(), 100, max_step_tokens=0)
