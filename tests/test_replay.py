"""Replay benchmark on a small synthetic JSONL (no vLLM engine)."""

import json
import math

import numpy as np
import pytest

from das_trl.bench import drafters, replay, report, sets, simulation, suite
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


# ---------------------------------------------------------------------------- what the engine waits for
class _FakeClock:
    """A clock that only moves when a test says so (seconds)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _split(jsonl):
    train, evals, _, _ = sets.split_epochs(sets.load_epochs(jsonl), None, None)
    return train, evals


def test_cpu_inclusive_time_is_cost_model_plus_measured_proposer_time(jsonl, monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(simulation, "cpu_clock", clock)
    train, evals = _split(jsonl)

    class Costly(drafters.Drafter):
        """Every proposal takes 2 ms of (fake) CPU; every step leaves 9 ms of background work."""
        name = "costly"

        def budgets(self, running):
            self.watch.add_background(0.009)
            return [3] * len(running)

        def propose(self, rid, context, budget):
            clock.now += 0.002
            return [0] * budget  # never accepted

    res = simulation.simulate(Costly(), train, evals, 7.0, 0.025)
    running = [b for _, b in res.batch_trace[:-1]]
    assert res.proposer_seconds == pytest.approx([0.002 * b for b in running])
    assert res.drafter_seconds == pytest.approx(0.002 * res.rounds)
    # background work is charged only beyond its step's forward pass
    fwd = [7.0 + 0.025 * t for t in res.step_tokens]
    bg_ms = sum(max(0.0, 9.0 - f) for f in fwd)
    assert bg_ms > 0 and any(f > 9.0 for f in fwd)  # some steps hide it entirely, others do not
    base = res.time_at(7.0, 0.025)
    assert base == pytest.approx(res.sim_time_ms)
    assert res.time_with_cpu(7.0, 0.025) == pytest.approx(base + 2.0 * res.rounds + bg_ms)
    assert res.time_with_cpu(7.0, 0.025, async_off_ms=0.5) == pytest.approx(base + 2.0 * res.rounds + bg_ms
                                                                           + 0.5 * res.steps)
    # a host twice as fast halves the measured CPU (and the background beyond the forward pass)
    bg_fast = sum(max(0.0, 4.5 - f) for f in fwd)
    assert res.time_with_cpu(7.0, 0.025, host_speed=2.0) == pytest.approx(base + 1.0 * res.rounds + bg_fast)
    # re-costed under another cost model, the background charge follows that model's forward time
    fwd2 = [5.0 + 0.1 * t for t in res.step_tokens]
    assert res.cpu_ms(5.0, 0.1) == pytest.approx(2.0 * res.rounds + sum(max(0.0, 9.0 - f) for f in fwd2))

    # none runs no proposer: it adds nothing, not even the async-scheduling charge
    clock.now = 0.0
    none = simulation.simulate(drafters.make_drafter("none"), train, evals, 7.0, 0.025)
    assert none.cpu_ms(7.0, 0.025) == 0.0
    assert none.time_with_cpu(7.0, 0.025, host_speed=0.1, async_off_ms=3.0) == none.time_at(7.0, 0.025)
    rat = report.ratios([none, res], 7.0, 0.025)
    assert rat["none"]["time_cpu_vs_none"] == 1.0
    assert rat["costly"]["time_cpu_ms"] == pytest.approx(base + 2.0 * res.rounds + bg_ms)


def test_das_controller_times_exactly_the_speculator_calls(jsonl, monkeypatch):
    """das+controller drives the proposer's Speculator: one start per request, one step per engine step plus the
    one after the last forward pass, one finish per request; only those calls are timed."""
    from das_trl.vllm.speculator import Speculator

    clock = _FakeClock()
    monkeypatch.setattr(simulation, "cpu_clock", clock)
    calls = {"start": 0, "step": 0, "finish": 0}
    cost = {"start": 0.001, "step": 0.003, "finish": 0.0005}
    for name in calls:
        real = getattr(Speculator, name)

        def timed(self, *a, _real=real, _name=name, **k):
            calls[_name] += 1
            clock.now += cost[_name]
            return _real(self, *a, **k)

        monkeypatch.setattr(Speculator, name, timed)
    train, evals = _split(jsonl)
    d = drafters.make_drafter("das+controller", controller_config=drafters.controller_config(7.0, 0.025))
    res = simulation.simulate(d, train, evals, 7.0, 0.025, warmup=False)
    n = len(evals)
    assert calls == {"start": n, "step": res.steps + 1, "finish": n}
    expected = n * cost["start"] + (res.steps + 1) * cost["step"] + n * cost["finish"]
    assert res.drafter_seconds == pytest.approx(expected)
    assert 1000.0 * sum(res.proposer_seconds) == pytest.approx(1000.0 * expected)
    assert res.counters["steps"] == res.steps + 1 and res.counters["request_rounds"] == res.rounds + n


def _random_batch(rng, prompts, epoch, long_rows=(), vocab=5000):
    """Four completions per prompt, random tokens of 40-80; a long row runs to 600 tokens and, past its first 100
    random tokens, repeats a 24-token phrase (the loop a long chain of thought can fall into): a draft can pay there,
    and only there."""
    out = []
    for p, prompt in enumerate(prompts):
        for s in range(4):
            if p * 4 + s in long_rows:
                phrase = rng.integers(1, vocab, 24).tolist()
                tokens = rng.integers(1, vocab, 100).tolist() + (phrase * 21)[:500]
            else:
                tokens = rng.integers(1, vocab, int(rng.integers(40, 80))).tolist()
            out.append(RolloutRecord.make(epoch, float(epoch), prompt, tokens, "stop"))
    return out


def test_ingest_that_outlasts_the_forward_pass_is_charged_to_the_critical_path(jsonl):
    """das+controller's real ingest thread: the replay completes each step's deferred ingest after the step and
    keeps its time as that step's background work. Under a cost model whose forward pass takes no time, none of it
    finishes within its step, so all of it is charged (cpu_ms = the calls' time + every step's background); under
    forward passes far longer than any step's ingest, none is; the suite reports the background beside it."""
    train, evals = _split(jsonl)
    d = drafters.make_drafter("das+controller", controller_config=drafters.controller_config(7.0, 0.025))
    res = simulation.simulate(d, train, evals, 7.0, 0.025)
    crit = 1000.0 * sum(res.proposer_seconds)
    bg = res.background_ms()
    assert bg > 0.0 and len(res.background_seconds) == res.steps
    assert res.background_excess_ms(0.0, 0.0) == pytest.approx(bg)
    assert res.cpu_ms(0.0, 0.0) == pytest.approx(crit + bg)
    assert res.background_excess_ms(1000.0, 0.0) == 0.0 and res.cpu_ms(1000.0, 0.0) == pytest.approx(crit)
    # each step is charged only its own background beyond its own forward pass
    worst = max(res.background_seconds)
    assert res.background_excess_ms(1000.0 * worst / 2.0, 0.0) == pytest.approx(
        sum(max(0.0, 1000.0 * b - 1000.0 * worst / 2.0) for b in res.background_seconds))
    rat = report.ratios([res], 0.0, 0.0)[res.name]
    assert rat["bg_ms_per_step"] == pytest.approx(bg / res.steps) and rat["bg_excess_ms"] == pytest.approx(bg)
    assert rat["cpu_ms_per_step"] == pytest.approx((crit + bg) / res.steps)


def test_large_low_acceptance_batch_drafts_nothing_until_it_drains_to_the_long_requests():
    """160 requests of random tokens (history: other random completions of the same prompts), 4 of them 600 tokens
    long (a repeated phrase after their first 100), the rest 40-80: while the batch is large no row is speculated
    (the Speculator's counters), and the few long requests left at the end are drafted."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 5000, 24).tolist() for _ in range(40)]
    train = [_random_batch(rng, prompts, e) for e in range(2)]
    evals = _random_batch(rng, prompts, 2, long_rows=(3, 50, 101, 150))
    d = drafters.make_drafter("das+controller", controller_config=drafters.controller_config(7.0, 0.025))
    res = simulation.simulate(d, train, evals, 7.0, 0.025)
    running = [b for _, b in res.batch_trace[:-1]]
    speculated = d.speculated_per_step  # one per Speculator.step: the engine steps, then the one after the last
    assert len(speculated) == res.steps + 1
    large = [i for i, b in enumerate(running) if b >= 100 and i >= 3]
    assert len(large) >= 30
    busy = [(i, running[i], speculated[i]) for i in large if speculated[i]]
    assert not busy, f"(step, running, rows speculated) while the batch is large: {busy}"
    assert all(d.silent_per_step[i] == 1 for i in large)
    assert res.counters["silent_steps"] >= len(large)
    # most of those steps skip the plan too (BudgetController.quiet_step): only recomputations and new requests plan
    assert res.counters["quiet_steps"] >= len(large) // 2, (res.counters["quiet_steps"], len(large))
    # ... and as the batch drains to the four long requests, they are drafted
    assert running[-10] == 4 and all(1 <= b <= 4 for b in running[-10:])  # the long ones may end a step apart
    assert all(s > 0 for s in speculated[-10:-1]), speculated[-10:]
    assert res.counters["speculated_rows"] > 0


def test_cpu_knobs_reach_the_replay_json(jsonl, tmp_path):
    out = tmp_path / "knobs.json"
    assert replay.main(["--rollouts", str(jsonl), "--drafters", "none,suffix,das+controller", "--host-speed", "2",
                        "--async-off-ms", "1.5", "--draft-threads", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["host_speed"] == 2.0 and data["async_off_ms"] == 1.5 and data["draft_threads"] == 2
    by = {r["drafter"]: r for r in data["results"]}
    assert by["das+controller"]["cpu_clock"] == "wall" and by["suffix"]["cpu_clock"] == "thread"
    assert by["none"]["cpu_clock"] == "none" and by["none"]["time_cpu_ms"] == by["none"]["time_ms"]
    for name in ("suffix", "das+controller"):  # speculative: the async-off charge on every step, plus the CPU
        r = by[name]
        assert r["time_cpu_ms"] == pytest.approx(r["time_ms"] + r["cpu_ms"] + 1.5 * r["tail_passes"])
        assert r["cpu_ms"] == pytest.approx(1000.0 * r["drafter_seconds"] / 2.0, rel=0.3)  # + background beyond fwd
    assert drafters.make_drafter("das+siblings").wall_timed is False


def _one_long_predictable_row(rng, prompts, epoch, long_text):
    """Four completions per prompt: row 0 is ``long_text`` in every epoch (its history predicts it exactly: it
    drafts long and is sure to finish last), the others random tokens of 40-80."""
    out = []
    for p, prompt in enumerate(prompts):
        for s in range(4):
            tokens = list(long_text) if p == s == 0 else rng.integers(1, 5000, int(rng.integers(40, 80))).tolist()
            out.append(RolloutRecord.make(epoch, float(epoch), prompt, tokens, "stop"))
    return out


def test_padded_logprobs_cut_a_long_draft_in_a_large_batch_and_patched_keeps_it():
    """128 requests, one of them 600 tokens that its history predicts exactly, at 5 us per logprob row (a slower GPU
    or a larger vocabulary than the assumed 1 us): with das-trl's patch (one logprob row per verified position) the
    sure-last row drafts long while the batch is large; on vLLM's padded path (128 rows x (longest + 1)) the
    controller cuts that draft while the batch is large, drafts it long once the batch has drained, never keeps a
    draft whose padding costs more than its expected saving, and beats the controller that ignores the padding under
    the padded price. The tokens are the same."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 5000, 24).tolist() for _ in range(32)]
    long_text = rng.integers(1, 5000, 600).tolist()
    train = [_one_long_predictable_row(rng, prompts, e, long_text) for e in range(2)]
    evals = _one_long_predictable_row(rng, prompts, 2, long_text)
    c_logprob = 0.005
    runs = {}
    for shape in ("patched", "padded"):
        cc = drafters.controller_config(7.0, 0.025, None, c_logprob, shape)
        runs[shape] = simulation.simulate(drafters.make_drafter("das+controller", controller_config=cc), train,
                                          evals, 7.0, 0.025, c_logprob=c_logprob, verification_shape=shape)
    patched, padded = runs["patched"], runs["padded"]

    def longest(res, rows_ok):
        return max((d for r, d in zip(res.step_rows, res.step_longest) if rows_ok(r)), default=0)

    assert patched.tokens == padded.tokens == sum(len(r.completion_ids) for r in evals)
    assert longest(patched, lambda r: r >= 64) >= 16  # the patch: the long draft pays at any batch size
    assert patched.counters["budget_padding_cut_steps"] == 0
    assert longest(padded, lambda r: r >= 64) <= 4  # padded: 128 rows x 5 us per position is more than it saves
    assert longest(padded, lambda r: r <= 4) >= 16  # ... until the batch has drained
    assert padded.counters["budget_padding_cut_steps"] > 0
    assert padded.counters["budget_padding_over_saving_steps"] == 0
    unaware = patched.priced(c_logprob, "padded")  # the same drafts sent to an unpatched vLLM
    assert unaware.logprob_rows() > padded.logprob_rows()
    assert padded.time_at(7.0, 0.025) < unaware.time_at(7.0, 0.025)


def test_admission_lets_waiting_prompts_in_before_drafts():
    """With a token budget, requests enter with their prompts' prefill (chunked, the prefix cache for a problem's
    later prompts), waiting prompts take the budget before drafts, and each request's first token comes in the same
    step with drafts as without: the drafts never hold a prompt back."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 5000, 40).tolist() for _ in range(16)]
    long_text = rng.integers(1, 5000, 300).tolist()
    train = [_one_long_predictable_row(rng, prompts, e, long_text) for e in range(2)]
    evals = _one_long_predictable_row(rng, prompts, 2, long_text)
    adm = simulation.Admission(token_budget=128, max_num_seqs=64)
    runs = {}
    for name in ("none", "das+controller"):
        cc = drafters.controller_config(7.0, 0.025, None, 0.001)
        runs[name] = simulation.simulate(drafters.make_drafter(name, controller_config=cc), train, evals, 7.0, 0.025,
                                         c_logprob=0.001, admission=adm)
    none, das = runs["none"], runs["das+controller"]
    assert none.first_token_steps == das.first_token_steps
    assert max(none.first_token_steps) > 1  # 64 prompts of 40 tokens do not fit one step of 128
    assert all(t <= 128 for t in none.step_tokens + das.step_tokens)
    # the first of four siblings computes 40 prompt tokens, the later ones (a prefix-cache hit) 40 - 32
    assert none.prefill_tokens == das.prefill_tokens < 64 * 40
    assert das.tokens == none.tokens and das.draft_tokens > 0
    assert das.time_at(7.0, 0.025) < none.time_at(7.0, 0.025)
    with pytest.raises(ValueError, match="max_num_seqs"):
        simulation.Admission(token_budget=16, max_num_seqs=32)


def test_the_profiled_verification_limits_hold_in_the_replay():
    """With a GPU engine's profiled limits (N = min(rows, budget) draft tokens per step; N / N = 1 per row where the
    logprob path is padded) the default drafter never verifies more, and sends the same tokens."""
    rng = np.random.default_rng(2)
    prompts = [rng.integers(1, 5000, 24).tolist() for _ in range(4)]
    long_text = rng.integers(1, 5000, 200).tolist()
    train = [_one_long_predictable_row(rng, prompts, e, long_text) for e in range(2)]
    evals = _one_long_predictable_row(rng, prompts, 2, long_text)
    for shape, per_row in (("patched", None), ("padded", 1)):
        limits = simulation.profiled_limits(len(evals), 8192, shape)
        assert limits.draft_tokens == len(evals) == 16 and limits.longest_draft == per_row
        cc = drafters.controller_config(7.0, 0.025, None, 0.001, shape)
        free = simulation.simulate(drafters.make_drafter("das+controller", controller_config=cc), train, evals,
                                   verification_shape=shape)
        held = simulation.simulate(drafters.make_drafter("das+controller", controller_config=cc), train, evals,
                                   verification_shape=shape, limits=limits)
        assert max(free.step_drafts) > 16 or max(free.step_longest) > (per_row or 64)  # the limit binds
        assert max(held.step_drafts) <= 16 and max(held.step_longest) <= (per_row or 64)
        assert held.tokens == free.tokens and held.draft_tokens < free.draft_tokens


def test_replay_table_names_the_default_drafter_under_its_rows(jsonl, capsys):
    assert replay.main(["--rollouts", str(jsonl), "--drafters", "none,suffix,das+controller"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"{report.DEFAULT}: das-trl's default drafter" in lines
    # the rows themselves are unchanged: the default's row has the name alone and as many columns as none's
    rows: dict[str, list[str]] = {}
    for line in lines:  # the table's rows come first (the tiers below repeat the names)
        if line.split() and line.split()[0] in ("none", "suffix", report.DEFAULT):
            rows.setdefault(line.split()[0], line.split())
    assert len(rows[report.DEFAULT]) == len(rows["none"]) == 14
    # without the default among the drafters, no such line
    assert replay.main(["--rollouts", str(jsonl), "--drafters", "none,suffix"]) == 0
    assert "default drafter" not in capsys.readouterr().out


def test_replay_table_has_a_legend_of_its_columns_and_the_suite_tables_do_not(jsonl, capsys):
    assert replay.main(["--rollouts", str(jsonl), "--drafters", "none,suffix,das+controller"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # under the table (after its cost-model line and the default's line), before the tiers
    start = next(i for i, x in enumerate(lines) if x.startswith("cost model "))
    end = next(i for i, x in enumerate(lines) if x.startswith("tokens/round by length"))
    assert lines[start + 1] == f"{report.DEFAULT}: das-trl's default drafter"
    text = " ".join(lines[start + 2:end])
    for column in ("tok/rd:", "vs sfx:", "tail:", "vs best", "+CPU ms:", "CPU ms/st", "us/req-rd", "bg ms/st:",
                   "oracle-trim", "oracle-text"):
        assert column in text, (column, lines[start:end])
    assert len(next(x for x in lines if x.startswith("none ")).split()) == 14  # the rows are unchanged
    # the suite prints a table per point and cost model: no legend repeated under each (format_table's default)
    train, evals, _, _ = sets.split_epochs(sets.load_epochs(jsonl), None, None)
    assert "tok/rd:" not in report.format_table([simulation.simulate(drafters.make_drafter("none"), train, evals)])


def test_replay_legend_says_what_the_bounds_and_the_suffix_columns_are(jsonl, capsys):
    # The legend said oracle-trim cut "the default's drafts" (Bounds cuts das+siblings' at the hard cap) and gave
    # oracle-text's cap as "the same cap"; it did not say what vs sfx / vs best show without suffix.
    from das_trl.drafter.config import DEFAULT_MAX_SPEC_TOKENS

    assert replay.main(["--rollouts", str(jsonl), "--drafters", "none,das+controller"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("cost model "))
    legend = lines[start + 2:start + 2 + len(report.table_legend())]
    assert tuple(legend) == report.table_legend() and all(len(x) <= 120 for x in legend)
    text = " ".join(x.strip() for x in legend)
    assert "the default's drafts" not in text and "same cap" not in text
    assert "das+siblings' drafts at the hard cap, each cut to its accepted tokens" in text
    assert f"the true continuation at the draft cap K = {DEFAULT_MAX_SPEC_TOKENS}" in text
    assert "with suffix not among --drafters, vs sfx shows - and vs best equals vs none" in text
    # ... which is what the rows show here, suffix not replayed: vs sfx -, vs best = vs none (both columns)
    for name in ("none", report.DEFAULT, "oracle-trim"):
        row = next(x for x in lines if x.startswith(name + " ")).split()
        assert row[2] == "-" and row[6] == row[7] and row[12] == row[13], row


def test_replay_footer_names_the_logprob_price_as_the_first_line_does(jsonl, capsys):
    # The first line gave "+ 0.001 ms per logprob row (patched)"; the footer under the table left that term out.
    assert replay.main(["--rollouts", str(jsonl), "--drafters", "none,suffix", "--c-logprob", "0.002",
                        "--verification-shape", "padded"]) == 0
    lines = capsys.readouterr().out.splitlines()
    term = "cost model 7.0 ms + 0.025 ms/token + 0.002 ms per logprob row (padded)"
    assert term in lines[0]
    assert next(x for x in lines if x.startswith("cost model ")).startswith(term + "; CPU: ")


@pytest.mark.parametrize("parse", [replay.parse_args, suite.parse_args])
def test_cpu_options_heading_states_the_time_with_the_cpu_with_its_logprob_charge(parse, capsys):
    # The heading left out the logprob rows' charge that time ms (and so +CPU ms) includes
    with pytest.raises(SystemExit):
        parse(["--help"])
    assert ("proposer CPU (the time with the CPU: c_base * steps + c_tok * verified tokens + c_logprob * logprob "
            "rows + proposer CPU / host speed + async-off charge)") in capsys.readouterr().out


def test_replay_bounds_take_the_drafters_cap_from_das_config(jsonl, capsys):
    # oracle-text was always at K = 64 in bench replay (Bounds.of's default) while the suite passed the drafters' cap
    # from --das-config: with max_spec_tokens 16 oracle-trim cut K-16 drafts but oracle-text drafted 64.
    assert replay.main(["--rollouts", str(jsonl), "--drafters", "none", "--das-config",
                        '{"max_spec_tokens": 16}']) == 0
    out = capsys.readouterr().out
    assert "the true continuation at the draft cap K = 16" in out
    assert "K = 64" not in out
