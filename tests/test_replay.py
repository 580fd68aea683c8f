"""Replay benchmark on a small synthetic JSONL (no vLLM engine)."""

import json
import math

import numpy as np
import pytest

from das_trl.bench import drafters, replay, report, sets, simulation
from das_trl.bench.drafters.ngram import prompt_lookup
from das_trl.drafter.rollout_log import RolloutRecord, append_records


def _records(seed_per_epoch, problems=6, samples=4, epochs=3, vocab=400):
    """Each problem has a template completion; epochs perturb a few tokens per sample (with per-epoch seeds)."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab, size=20).tolist() for _ in range(problems)]
    templates = [rng.integers(1, vocab, size=int(rng.integers(20, 120))).tolist() for _ in range(problems)]
    out = []
    for e in range(epochs):
        r = np.random.default_rng(seed_per_epoch(e))
        for p, t in zip(prompts, templates):
            for _ in range(samples):
                c = list(t)
                for j in r.choice(len(c), size=max(1, len(c) // 15), replace=False):
                    c[j] = int(r.integers(1, vocab))
                out.append(RolloutRecord.make(e, float(e), p, c, "stop"))
    return out


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "r.jsonl"
    append_records(path, _records(lambda e: 100 + e))
    return path


def test_no_drafter_is_one_token_per_round(jsonl):
    train, evals, _, _ = sets.split_epochs(sets.load_epochs(jsonl), None, None)
    res = simulation.simulate(drafters.make_drafter("none"), train, evals)
    assert res.tokens == sum(len(r.completion_ids) for r in evals)
    assert res.tokens_per_round == 1.0
    assert res.steps == max(len(r.completion_ids) for r in evals)
    assert res.draft_tokens == 0
    # cost model: every step costs c_base + c_tok * running
    expected = sum(7.0 + 0.025 * b for _, b in res.batch_trace[:-1])
    assert math.isclose(res.sim_time_ms, expected)


def test_das_with_history_equal_to_eval_beats_one(tmp_path):
    recs = _records(lambda e: 7)  # every epoch identical: history == eval completions
    train, evals, _, _ = sets.split_epochs({0: recs[:len(recs) // 3], 1: recs[len(recs) // 3:2 * len(recs) // 3],
                                              2: recs[2 * len(recs) // 3:]}, None, None)
    assert [r.completion_ids for r in train[0]] == [r.completion_ids for r in evals]
    for name in ("das-problem", "das+siblings", "das+policy"):
        res = simulation.simulate(drafters.make_drafter(name), train, evals)
        assert res.tokens == sum(len(r.completion_ids) for r in evals)
        assert res.tokens_per_round > 3.0, name
        assert res.accepted_tokens > 0 and res.steps < max(len(r.completion_ids) for r in evals)


def test_acceptance_stops_at_first_mismatch():
    rec = RolloutRecord.make(0, 1.0, [1, 2, 3], [10, 11, 12, 13, 14], "stop")

    class Wrong(drafters.Drafter):
        name = "wrong"

        def budgets(self, running):
            return [4] * len(running)

        def propose(self, rid, context, budget):
            return [99] * budget if len(context) == 3 else [int(context[-1]) + 1, 0, 0, 0]

    res = simulation.simulate(Wrong(), [], [rec])
    # round 1: draft wrong -> emit 1; round 2: first draft token right (11), then wrong -> emit 2; round 3 same
    assert res.rounds == 3 and res.tokens == 5
    assert res.accepted_tokens == 2 and res.draft_tokens == 12


def test_baselines_run_and_table_prints(jsonl, tmp_path, capsys):
    out = tmp_path / "res.json"
    rc = replay.main(["--rollouts", str(jsonl), "--drafters", "none,ngram,suffix,das+siblings,das+policy,das+cost",
                      "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for name in ("none", "ngram*", "suffix", "das+policy", "tok/rd", "oracle-trim", "oracle-text", "+CPU ms"):
        assert name in text
    data = json.loads(out.read_text())
    by = {r["drafter"]: r for r in data["results"]}
    assert by["none"]["tokens_per_round"] == 1.0
    assert by["suffix"]["tokens_per_round"] > 1.0  # earlier epochs are cached responses
    assert by["das+siblings"]["tokens_per_round"] > 1.0
    # times without and with the CPU, and the bounds, for every drafter
    assert by["none"]["cpu_ms"] == 0.0 and by["none"]["time_cpu_ms"] == by["none"]["time_ms"]
    assert by["suffix"]["cpu_ms"] > 0 and by["suffix"]["time_cpu_ms"] > by["suffix"]["time_ms"]
    assert by["ngram"]["cpu_representative"] is False
    rat = data["ratios"]
    assert rat["oracle-trim"]["bound"] and rat["oracle-text"]["bound"]
    assert rat["oracle-trim"]["time_ms"] <= by["das+siblings"]["time_ms"]
    assert rat["oracle-text"]["time_ms"] <= rat["oracle-trim"]["time_ms"]
    assert rat["none"]["time_cpu_vs_none"] == 1.0


def test_prompt_lookup_matches_vllm_semantics():
    toks = np.array([1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 7, 1, 2, 3, 4, 5])
    # longest suffix n-gram (n=5) first occurs at 0 -> propose what followed it there
    assert prompt_lookup(toks, 5, 5, 3) == [9, 1, 2]
    assert prompt_lookup(np.array([1, 2, 3]), 5, 5, 3) == []


def test_plots(jsonl, tmp_path):
    pytest.importorskip("matplotlib")
    train, evals, _, _ = sets.split_epochs(sets.load_epochs(jsonl), None, None)
    res = [simulation.simulate(drafters.make_drafter(n), train, evals) for n in ("none", "das+policy")]
    files = report.write_plots(res, tmp_path / "plots", [len(r.completion_ids) for r in train[0]])
    assert len(files) == 3 and all((tmp_path / "plots" / f.split("/")[-1]).stat().st_size > 0 for f in files)


def test_epochs_grouped_by_appearance(tmp_path):
    # TRL-style fractional epochs reported at the end of each step: 2 problems per step, 2 steps per epoch
    path = tmp_path / "grpo.jsonl"
    recs = []
    for step in range(4):
        prompt = [1, 2, 3 + step % 2]
        recs.append(RolloutRecord.make(step, 0.5 * (step + 1), prompt, [5, 6, step], "stop"))
    append_records(path, recs)
    by_app = sets.load_epochs(path)
    assert sorted(by_app) == [0, 1] and [r.step for r in by_app[0]] == [0, 1] and [r.step for r in by_app[1]] == [2, 3]
    by_floor = sets.load_epochs(path, "epoch")
    assert [r.step for r in by_floor[1]] == [1, 2]  # floor() would mix appearances
