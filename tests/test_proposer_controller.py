"""The live proposer's budgets come from the batch budget controller: rows its plan finds worth drafting are drafted up
to their hard cap, the others not at all, the controller's cut shortens the drafts, the cut length is what gets reported as verified, the controller's
diagnostics come up through stats() by prefix, and its online cost fit sees the engine's step times and token
counts. Fast: real DASWorkerExtension + DASProposer + DASDrafter behind a fake model runner (``reliability_fakes``)."""

import json

import numpy as np
import pytest

from reliability_fakes import K, FakeWorker, push_long_and_short_history, run_round


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _setup(rng, controller: dict | None = None):
    worker = FakeWorker()
    assert worker.das_attach(json.dumps({} if controller is None else {"budget_controller": controller}))["ok"]
    prompts, texts = push_long_and_short_history(worker, rng)
    return worker, prompts, texts


_round = run_round


def test_controller_is_the_default_and_its_budgets_cut_the_drafts(rng, monkeypatch):
    worker, prompts, texts = _setup(rng)
    proposer = worker.proposer
    rows = [("a", 0, 5), ("b", 3, 5)]
    _round(worker, prompts, texts, rows)
    seen = {}

    real = proposer.controller.cut

    def fixed_cut(plan, accept, rows=None, **kw):
        seen.update(accept=accept.copy(), output_len=plan.generated.copy(), rows=np.asarray(rows))
        real(plan, accept, rows, **kw)
        return np.array([3, 0], np.int32)

    monkeypatch.setattr(proposer.controller, "cut", fixed_cut)
    drafts = _round(worker, prompts, texts, [("a", 0, 6), ("b", 3, 6)])
    assert (seen["accept"][:, 0] > 0).all()  # both rows were drafted before the controller chose
    assert seen["output_len"].tolist() == [6, 6] and seen["rows"].tolist() == [0, 1]
    assert drafts == [texts[0][6:9], []]
    # Next round: row "a" verified 3 tokens, accepted 2. Only the 3 verified tokens reach the calibration.
    before = proposer.drafter.stats()["calibration_tokens"]
    worker.model_runner.set_rows([("a", prompts[0], texts[0][:9]), ("b", prompts[3], texts[3][:7])])
    worker.model_runner.step([texts[0][6:9], [texts[3][6]]])
    assert proposer.drafter.stats()["calibration_tokens"] - before == 3
    assert proposer.stats()["accepted_tokens"] == 2


def test_only_the_request_that_will_finish_last_drafts_when_tokens_are_expensive(rng):
    # Trust the lengths (no shrinkage towards "anyone may be last", no pooled lengths): the 40-token problem's
    # request cannot be last, so at 0.5 ms per verified token the plan does not even draft it; the 200-token
    # problem's request will be, and drafts its whole hard cap (K) while its drafts hold: the engine accepts all K
    # tokens of the first draft (plus the bonus token), so the plan's per-row cap stays at K. No logprob price: the
    # test process may not have das-trl's logprob patch installed (a padded shape would cut the last position, which
    # pays ~nothing at this c_tok, for a padding row that costs ~nothing).
    worker, prompts, texts = _setup(rng, {"cost_source": "config", "c_tok_ms": 0.5, "tail_prior_weight": 0.0,
                                          "pooled_weight": 0.0, "c_logprob_ms": 0.0})
    first = _round(worker, prompts, texts, [("long", 0, 5), ("short", 3, 5)])
    assert first[0] == texts[0][5:5 + K] and first[1] == []
    n = 5 + K + 1
    worker.model_runner.set_rows([("long", prompts[0], texts[0][:n]), ("short", prompts[3], texts[3][:6])])
    drafts = worker.model_runner.step([texts[0][5:n], [texts[3][5]]])
    assert drafts[0] == texts[0][n:n + K]
    assert drafts[1] == []
    s = worker.proposer.stats()
    assert s["budget_steps"] == 2 and s["budget_rows"] == 4
    assert s["budget_kept_tokens"] == s["draft_tokens"] == 2 * K
    # The short request was never drafted: the drafter speculated 2 of 4 request-rounds, and nothing was cut.
    assert s["speculated_rows"] == s["budget_rows_speculated"] == 2
    assert s["budget_offered_tokens"] == s["budget_kept_tokens"]
    assert "budget_kept_tokens" in s["budget_counters"]
    assert s["budget_c_base_ms"] == 7.0 and s["budget_cost_online"] == 0


def test_online_cost_fit_sees_step_times_and_tokens(rng, monkeypatch):
    worker, prompts, texts = _setup(rng, {"cost_source": "online", "fit_min_steps": 8, "fit_min_r2": 0.9})
    proposer = worker.proposer
    clock = {"now": 100.0}
    proposer._clock = lambda: clock["now"]
    step = {"i": 0}
    real = proposer.controller.cut

    def varied(plan, accept, rows=None, **kw):  # vary the draft lengths so the token counts spread
        real(plan, accept, rows, **kw)
        step["i"] += 1
        return np.array([step["i"] % (K + 1), (3 * step["i"]) % (K + 1), 1], np.int32)[: len(accept)]

    monkeypatch.setattr(proposer.controller, "cut", varied)
    n = 3
    pos = [5] * n
    drafts = _round(worker, prompts, texts, [(f"r{i}", i, pos[i]) for i in range(n)])  # first sight: prefill step
    for _ in range(12):
        # The step the engine now runs verifies 1 + len(draft) tokens per row; make it take 2 + 0.5 * tokens ms.
        tokens = sum(1 + len(d) for d in drafts)
        clock["now"] += (2.0 + 0.5 * tokens) / 1000.0
        pos = [p + 1 for p in pos]  # every draft rejected: one token per round (same row set, no prefill)
        drafts = _round(worker, prompts, texts, [(f"r{i}", i, pos[i]) for i in range(n)])
    s = proposer.stats()
    assert s["budget_fit_steps"] == 12  # the first (prefill) step is not counted: its tokens are unknown
    assert s["budget_fit_c_base_ms"] == pytest.approx(2.0) and s["budget_fit_c_tok_ms"] == pytest.approx(0.5)
    assert s["budget_cost_online"] == 1 and s["budget_c_tok_ms"] == pytest.approx(0.5)


def test_every_row_gets_its_own_draft_list(rng):
    """vLLM keeps each row's list as its request's ``spec_token_ids`` and trims it in place: no two rows may share
    one, whether they were drafted or not (the proposer makes the empty ones in one call)."""
    worker, prompts, texts = _setup(rng, {"c_tok_ms": 10.0})  # verification so dear that no row drafts
    for length in (5, 6):
        drafts = _round(worker, prompts, texts, [("a", 0, length), ("b", 3, length), ("c", 1, length)])
        assert drafts == [[], [], []]
        assert len({id(d) for d in drafts}) == 3
    drafts[0].append(7)
    assert drafts[1] == [] and drafts[2] == []


def test_the_glue_benchmark_times_the_real_propose():
    """``scripts/bench_proposer_glue.py`` (the figure docs/benchmarks.md quotes) drives ``DASProposer.propose``
    itself: a change to what propose reads breaks it here, not silently."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_proposer_glue.py"
    spec = importlib.util.spec_from_file_location("bench_proposer_glue", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert 0.0 < module.glue_us(8, 20) < 1e5


def test_propose_hands_the_speculator_each_rows_sampled_count():
    """After a step that sent no draft every decoding row got one token, and propose skips reading the list
    lengths; after a step that sent drafts, or with a row still in prefill, it reads them. Either way the
    Speculator gets each row's true count (a wrong shortcut fails here)."""
    from types import SimpleNamespace

    from das_trl.bench.micro.drafter_speed import FakeBatch, _vllm_config
    from das_trl.drafter.draft_batch import DraftBatch
    from das_trl.vllm.proposer import DASProposer

    class Recording:
        def __init__(self, n):
            self.drafted, self.seen, self.n = False, [], n

        def tracked(self):
            return [f"r{i}" for i in range(self.n)]

        def __contains__(self, req_id):
            return True

        def __len__(self):
            return self.n

        def finish(self, req_id):
            pass

        def step(self, ids, matrix, rows, num_tokens, num_prompt, num_sampled, *rest):
            self.seen.append((list(ids), np.array(num_sampled).tolist()))
            return DraftBatch.empty(len(ids), 4)

    n = 4
    fb = FakeBatch(n, 32)
    for r in range(n):
        fb.req_ids.append(f"r{r}")
        fb.req_id_to_index[f"r{r}"] = r
    prop = DASProposer(_vllm_config(4, 64))
    prop.attach(SimpleNamespace(input_batch=fb, requests={}))
    prop.speculator = spec = Recording(n)
    prop.propose([[1]] * n, fb.num_tokens_no_spec, fb.token_ids_cpu)  # nothing in flight: the shortcut
    spec.drafted = True  # drafts went out: rows may have gained several tokens
    prop.propose([[1, 2, 3], [1], [4, 5], [6]], fb.num_tokens_no_spec, fb.token_ids_cpu)
    spec.drafted = False
    prop.propose([[1], [], [2], [3]], fb.num_tokens_no_spec, fb.token_ids_cpu)  # row 1 in prefill: not passed
    assert spec.seen == [(["r0", "r1", "r2", "r3"], [1, 1, 1, 1]), (["r0", "r1", "r2", "r3"], [3, 1, 2, 1]),
                         (["r0", "r2", "r3"], [1, 1, 1])]
