"""The replay suite (das-trl bench suite) on small synthetic sets: it finds *.jsonl and *.jsonl.gz files, replays
every one (and an early appearance where asked), re-costs cost-independent drafters per cost model, and writes the
table, JSON and one PNG per set and cost model. No vLLM engine."""

import gzip
import json
import shutil

import pytest

from das_trl.bench import sets as rollout_sets
from das_trl.bench import suite
from das_trl.bench.drafters import make_drafter
from das_trl.bench.sets import load_epochs, split_epochs
from das_trl.bench.simulation import simulate
from das_trl.drafter.rollout_log import append_records, read_records
from test_replay import _records


@pytest.fixture
def sets(tmp_path):
    folder = tmp_path / "sets"
    plain = folder / "synthetic.jsonl"
    append_records(plain, _records(lambda e: 100 + e, epochs=4))
    with plain.open("rb") as src, gzip.open(folder / "packed.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (folder / "notes.txt").write_text("not a rollout file")
    return folder


def test_gzip_sets_read_like_plain_ones(sets):
    assert [r.completion_ids for r in read_records(sets / "packed.jsonl.gz")] == \
        [r.completion_ids for r in read_records(sets / "synthetic.jsonl")]
    assert [p.name for p in rollout_sets.find_sets([sets])] == ["packed.jsonl.gz", "synthetic.jsonl"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rollout_sets.find_sets([sets.parent / "missing"])
    (sets.parent / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.jsonl"):
        rollout_sets.find_sets([sets.parent / "empty"])


def test_suite_table_json_and_plots(sets, tmp_path, capsys):
    out = tmp_path / "suite.json"
    rc = suite.main(["--sets", str(sets), "--c-tok", "0.025", "0.1", "--early-appearance", "1",
                     "--drafters", "none,suffix,das+policy,das+controller", "--json", str(out),
                     "--plots", str(tmp_path / "plots")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "default = das+controller" in text and "synthetic@1" in text and "oracle-trim" in text
    payload = json.loads(out.read_text())
    names = [p["name"] for p in payload["points"]]
    assert names == ["packed@1", "packed", "synthetic@1", "synthetic"]
    point = payload["points"][-1]
    for c_tok in ("0.025", "0.1"):
        rat = point["by_c_tok"][c_tok]["ratios"]
        assert rat["none"]["tail_vs_none"] == 1.0 and rat["suffix"]["tpr_vs_suffix"] == 1.0
        assert min(rat["none"]["time_vs_best"], rat["suffix"]["time_vs_best"]) == pytest.approx(1.0)
        assert rat["das+controller"]["us_per_round"] > 0
        assert rat["das+controller"]["time_cpu_ms"] > rat["das+controller"]["time_ms"]
        assert rat["none"]["time_cpu_ms"] == rat["none"]["time_ms"]
        for bound in ("oracle-trim", "oracle-text"):
            assert rat[bound]["bound"] and rat[bound]["time_cpu_ms"] == rat[bound]["time_ms"]
    assert point["bounds"]["trim_steps"] > 0
    rows = [r for r in payload["summary"] if r["set"] == "synthetic"]
    assert [r["c_tok"] for r in rows] == [0.025, 0.1]
    for r in rows:
        for key in ("time_cpu_vs_none", "time_cpu_vs_best", "gap_to_trim", "tokens_per_round"):
            assert r[key] == r[key], key  # not nan
    # one per point and cost model, and the reliability figure (at the middle cost model)
    assert len(list((tmp_path / "plots").glob("*.png"))) == 4 * 2 + 1
    assert (tmp_path / "plots" / "reliability_ctok0.1.png").exists()
    assert "predicted (controller) / realised acceptance" in text
    res = {r["drafter"]: r for r in point["by_c_tok"]["0.025"]["results"]}
    rel = res["das+controller"]["reliability"]
    sent = sum(b["tokens"] for b in rel["buckets"])
    assert sent == sum(rel["per_position"]["tokens"]) > 0 and "reliability" not in res["suffix"]


def test_recosting_equals_a_replay_under_that_cost_model(sets):
    train, evals, _, _ = split_epochs(load_epochs(sets / "synthetic.jsonl"), None, None)
    cheap = simulate(make_drafter("suffix"), train, evals, 7.0, 0.025)
    dear = simulate(make_drafter("suffix"), train, evals, 5.0, 0.1)
    assert cheap.time_at(5.0, 0.1) == pytest.approx(dear.sim_time_ms)


def test_cache_reuses_cost_independent_results(sets, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    args = ["--sets", str(sets / "synthetic.jsonl"), "--drafters", "none,suffix,das+controller", "--cache", str(cache),
            "--json", str(tmp_path / "a.json")]
    assert suite.main(args) == 0
    # das+siblings twice: the bound of the drafter's own cap and of the K-16 drafts (oracle-trim@16)
    assert sorted(p.name.split("-")[2] for p in cache.glob("*.json")) == ["das+siblings", "das+siblings", "none",
                                                                          "suffix"]
    calls = []
    real = suite.simulate
    monkeypatch.setattr(suite, "simulate", lambda d, *a, **k: calls.append(d.name) or real(d, *a, **k))
    assert suite.main(args[:-1] + [str(tmp_path / "b.json")]) == 0
    # none and suffix came from the cache (and were re-priced under the padded shape); the default plans for the
    # shape, so it runs under each
    assert calls == ["das+controller", "das+controller"]
    a, b = (json.loads((tmp_path / f).read_text())["points"][0]["by_c_tok"]["0.025"]["ratios"] for f in
            ("a.json", "b.json"))
    assert a["suffix"]["time_ms"] == b["suffix"]["time_ms"] and a["none"]["tail"] == b["none"]["tail"]


def test_long_drafts_show_the_short_drafts_bound_beside_their_own(sets, tmp_path, capsys):
    """With a cap above 16, the suite also replays das+siblings with the K-16 settings (oracle-trim@16) and computes
    oracle-text at the drafter's own cap."""
    out = tmp_path / "suite.json"
    rc = suite.main(["--sets", str(sets / "synthetic.jsonl"), "--c-tok", "0.025", "--early-appearance", "-1",
                     "--drafters", "none,suffix,das+controller", "--json", str(out),
                     "--das-config", json.dumps({"max_spec_tokens": 32, "max_spec_factor": 2.0, "max_tree_depth": 64})])
    assert rc == 0 and "trim16/bst" in capsys.readouterr().out
    point = json.loads(out.read_text())["points"][0]
    assert point["bounds"]["k"] == 32 and point["bounds"]["short_k"] == 16
    rat = point["by_c_tok"]["0.025"]["ratios"]
    assert rat["oracle-trim@16"]["bound"] and rat["oracle-trim@16"]["time_ms"] > 0
    assert rat["oracle-text"]["tail"] <= rat["oracle-trim"]["tail"]


def test_summary_without_the_default_drafter_shows_dashes_not_nan(sets, capsys):
    # The summary line is the default's: when it was not run its tokens per round printed "nan".
    assert suite.main(["--sets", str(sets / "synthetic.jsonl"), "--c-tok", "0.025", "--drafters", "none"]) == 0
    summary = capsys.readouterr().out.split("default = das+controller")[1]
    assert "nan" not in summary
    row = [line for line in summary.splitlines() if line.startswith("synthetic")][0]
    assert row.split()[3] == "-"  # set, c_tok, requests, tok/rd


def test_shapes_default_is_shown_as_typed_and_parses_to_the_list(monkeypatch, capsys):
    # --help showed the default as a Python list repr, ['patched', 'padded']: now as the user types it
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: the default is not wrapped apart
    with pytest.raises(SystemExit):
        suite.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "(default patched,padded)" in out and "['" not in out
    assert suite.parse_args(["--sets", "x"]).shapes == ["patched", "padded"]
    assert suite.parse_args(["--sets", "x", "--shapes", "padded"]).shapes == ["padded"]


def test_suite_table_footers_name_the_logprob_price_of_their_shape(sets, capsys):
    # The footer "cost model 7.0 ms + 0.025 ms/token" left the logprob rows out: each table names its own price
    # (the variant tables are priced under the other shape).
    assert suite.main(["--sets", str(sets / "synthetic.jsonl"), "--c-tok", "0.025", "--drafters", "none,suffix",
                       "--early-appearance", "-1", "--c-logprob", "0.002"]) == 0
    footers = [x for x in capsys.readouterr().out.splitlines() if x.startswith("cost model ")]
    assert footers == [f"cost model 7.0 ms + 0.025 ms/token + 0.002 ms per logprob row ({shape}); CPU: this "
                       "machine's thread CPU time / host speed 1, async-off charge 0 ms/step (speculative methods); "
                       "bounds: no CPU" for shape in ("patched", "padded")]


def test_help_shows_the_cost_model_defaults_and_lists_the_drafters_as_replay_does(monkeypatch, capsys):
    # --c-base, --c-tok and --early-appearance showed no default; --drafters pointed to an internal name
    from das_trl.bench.drafters import ALL_DRAFTERS

    monkeypatch.setenv("COLUMNS", "1000")  # one line per option
    with pytest.raises(SystemExit):
        suite.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--c-base C_BASE cost model: ms per forward pass (default: 7.0)" in out
    assert "--c-tok C_TOK [C_TOK ...] cost model: ms per token (several: a sweep; default: 0.025)" in out
    assert "than this + 1 (-1: never; default: 7)" in out
    assert f"--drafters DRAFTERS comma-separated from {','.join(ALL_DRAFTERS)}, each once" in out
    assert "ALL_DRAFTERS" not in out
    args = suite.parse_args(["--sets", "x"])
    assert (args.c_base, args.c_tok, args.early_appearance) == (7.0, [0.025], 7)


def test_json_names_the_code_checked_out_when_the_run_started(sets, tmp_path, monkeypatch):
    """A commit made while the suite runs is not the code that ran: the JSON used to name the checkout's commit at
    the time it was written."""
    checkout = {"das_trl_commit": "start"}
    monkeypatch.setattr(suite, "provenance", lambda: dict(checkout))
    run_point = suite.run_point

    def commit_meanwhile(*args, **kwargs):
        checkout["das_trl_commit"] = "committed-during-the-run"
        return run_point(*args, **kwargs)

    monkeypatch.setattr(suite, "run_point", commit_meanwhile)
    out = tmp_path / "suite.json"
    assert suite.main(["--sets", str(sets / "synthetic.jsonl"), "--c-tok", "0.025", "--early-appearance", "-1",
                       "--drafters", "none", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["das_trl_commit"] == "start"
