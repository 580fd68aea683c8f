"""The benchmarks page generator (das-trl bench page) on a small hand-built suite JSON, and the running-request
traces the suite writes for its figures. No replay runs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from das_trl.bench import page
from das_trl.bench.figures import write_figures
from das_trl.bench.report import DEFAULT, oracle_text_trace, running_trace
from das_trl.bench.simulation import Bounds, ReplayResult


def _ratios(none_ms: float, **vs_none: float) -> dict:
    out = {"none": {"time_cpu_ms": none_ms, "time_cpu_vs_none": 1.0, "time_cpu_vs_best": 1.0,
                    "tokens_per_round": 1.0, "cpu_ms_per_step": 0.0, "bound": False}}
    best = min(1.0, vs_none.get("suffix", 1.0))
    for name, r in vs_none.items():
        out[name] = {"time_cpu_ms": none_ms * r, "time_cpu_vs_none": r, "time_cpu_vs_best": r / best,
                     "tokens_per_round": 1.0 + r, "cpu_ms_per_step": 0.25, "bound": name.startswith("oracle")}
    return out


def _point(name: str, none_ms: float, default: float, **extra) -> dict:
    by = {}
    for c in ("0.005", "0.025", "0.1"):
        r = _ratios(none_ms, suffix=0.9, **{DEFAULT: default, "oracle-trim": 0.5, "oracle-text": 0.1})
        trace = {"none": [[0.0, 4], [none_ms / 2, 2], [none_ms, 0]],
                 "suffix": [[0.0, 4], [none_ms * 0.9, 0]],
                 DEFAULT: [[0.0, 4], [none_ms * default, 0]], "oracle-text": [[0.0, 4], [none_ms * 0.1, 0]]}
        by[c] = {"ratios": r, "results": [], "traces": trace}
    return dict({"name": name, "path": f"/data/{name}.jsonl", "eval_epoch": 3, "history_epochs": [0, 1, 2],
                 "requests": 4, "problems": 2, "tokens": 400, "bounds": None, "by_c_tok": by}, **extra)


@pytest.fixture
def payload() -> dict:
    return {"c_base_ms": 7.0, "c_tok_ms": [0.005, 0.025, 0.1], "drafters": ["none", "suffix", DEFAULT],
            "das_config_overrides": {}, "controller_overrides": {}, "draft_threads": 1, "host_speed": 1.0,
            "async_off_ms": 0.0, "summary": [],
            "points": [_point("frozen_smollm2_t06", 2000.0, 1.25),
                       _point("qwen25_05b_gsm8k_grpo_das", 1000.0, 0.5)]}


def test_main_table_has_every_point_the_reference_cost_model_and_the_bounds(payload):
    assert page.c_tok_key(payload) == "0.025" and page.c_tok_keys(payload) == ["0.005", "0.025", "0.1"]
    payload["points"][0]["by_c_tok"]["0.025"]["ratios"]["none"]["time_cpu_ms"] = 1234.0
    table = page.main_table(payload).splitlines()
    assert len(table) == 2 + 2
    assert "`oracle-trim` / none" in table[0] and "`oracle-text` / none" in table[0]
    t06 = table[2].split(" | ")
    assert t06[0] == "| `frozen_smollm2_t06`" and t06[2] == "1,234" and t06[3] == "0.90" and t06[4] == "**1.25**"
    assert t06[5] == "1.39"  # 1.25 / the better of none (1.0) and suffix (0.9)
    assert table[3].split(" | ")[4] == "**0.50**"


def test_optional_keys_get_a_column_and_a_section(payload):
    # An extra bound ("bound": true) on one point: a column for every point, "-" where absent.
    extra = dict(payload["points"][1]["by_c_tok"]["0.025"]["ratios"]["oracle-trim"], time_cpu_vs_none=0.4)
    payload["points"][1]["by_c_tok"]["0.025"]["ratios"]["oracle-trim@32"] = extra
    table = page.main_table(payload).splitlines()
    assert table[0].endswith("`oracle-trim@32` / none |")
    assert table[2].endswith("| - |") and table[3].endswith("| 0.40 |")
    assert "no reliability data" in page.reliability_block(payload)
    # The default's reliability summary in its result (das_trl.bench.reliability): one row per point with one.
    buckets = [{"positions": "1-4", "tokens": 1200, "predicted": 0.61, "realised": 0.55},
               {"positions": "5-16", "tokens": 0, "predicted": None, "realised": None}]
    payload["points"][1]["by_c_tok"]["0.025"]["results"] = [{"drafter": "suffix"},
                                                           {"drafter": DEFAULT, "reliability": {"buckets": buckets}}]
    rel = page.reliability_block(payload).splitlines()
    assert rel[0] == "| set | positions 1-4 | positions 5-16 |" and len(rel) == 3
    assert rel[2] == "| `qwen25_05b_gsm8k_grpo_das` | 0.61 / 0.55 (1,200) | - |"
    # Any other shape is shown as it is.
    payload["points"][0]["reliability"] = [{"position": "1-4", "predicted": 0.61, "realised": 0.55}]
    rel = page.reliability_block(payload)
    assert "**`frozen_smollm2_t06`**" in rel and "| position | predicted | realised |" in rel
    assert "| 1-4 | 0.610 | 0.550 |" in rel
    payload["host"] = {"cpus": 2}
    payload["das_trl_commit"] = "abc1234"
    assert "cpus 2" in page.settings_block(payload) and "`abc1234`" in page.settings_block(payload)


def test_engine_table_shows_the_default_under_the_padded_shape_and_with_admission(payload):
    assert "no other engine" in page.engine_table(payload)
    c = "0.025"
    padded = {"ratios": _ratios(2400.0, suffix=0.95, **{DEFAULT: 1.1}),
              "results": [{"drafter": DEFAULT, "counters": {"budget_padding_cut_steps": 37,
                                                             "budget_padding_over_saving_steps": 0}}]}
    admission = {"ratios": _ratios(2600.0, **{DEFAULT: 0.96}),
                 "results": [{"drafter": "none", "first_token_steps_mean": 1.5},
                             {"drafter": DEFAULT, "first_token_steps_mean": 1.5}]}
    payload["points"][0]["variants"] = {"padded": {c: padded}, "admission": {c: admission}}
    payload["verification_shapes"] = ["patched", "padded"]
    table = page.engine_table(payload).splitlines()
    assert table[0] == ("| set | requests | default / none (patched) | default / none (padded) | `suffix` / none "
                        "(padded) | default: steps cut for padding (padded) | default: padding > saving (padded) | "
                        "default / none (admission) | first token, steps: none / default |")
    assert table[2] == "| `frozen_smollm2_t06` | 4 | 1.25 | 1.10 | 0.95 | 37 | 0 | 0.96 | 1.5 / 1.5 |"
    assert table[3] == "| `qwen25_05b_gsm8k_grpo_das` | 4 | 0.50 | - | - | - | - | - | - / - |"  # no variants


def test_headline_gives_the_default_against_the_better_baseline_over_every_point(payload):
    # suffix 0.9 x none on both points: the default 1.25 and 0.5 x none are 1.25/0.9 and 0.5/0.9 x the better.
    s = page.headline_sentence(payload)
    mean = math.sqrt((1.25 / 0.9) * (0.5 / 0.9))
    assert f"takes {mean:.2f}x the time of the better of no speculation and vLLM's `suffix`" in s
    assert "range 0.56x to 1.39x, slower than that baseline on 1 of the 2" in s and "2 recorded rollout batches" in s
    assert "cost-model time, not GPU wall time (c_tok 0.025" in s and "\n" not in s
    table = page.headline_table(payload).splitlines()
    assert table[2] == ("| `frozen_smollm2_t06` | SmolLM2-135M, frozen policy, T 0.6; the last appearance (3) replayed "
                        "| 4 | 2 | 1.25 | **1.39** |")
    payload["points"][1]["name"] = "qwen25_05b_gsm8k_grpo_das@7"
    payload["points"].append(dict(payload["points"][0], name="unknown_set"))
    assert "an early appearance (3) replayed" in page.headline_table(payload).splitlines()[3]
    assert page.headline_table(payload).splitlines()[4].startswith("| `unknown_set` | - | 4 | 2 |")
    assert "3 recorded rollout batches" in page.headline_sentence(payload)


def test_the_committed_headline_is_traceable_to_the_suite_json():
    """Every number on the README's first screen, recomputed here from the committed suite JSON's raw times (each
    drafter's time with its CPU, not the JSON's own ratios)."""
    root = Path(__file__).resolve().parents[1]
    payload = page.load(root / "benchmarks" / "results" / "suite.json.gz")
    readme = root / "README.md"
    block = readme.read_text().split("<!-- bench:readme:start -->\n")[1].split("<!-- bench:readme:end -->")[0]
    c = page.c_tok_key(payload)
    assert c == "0.025" and "(c_tok 0.025 ms per verified token)" in block
    vs_best = []
    for p in payload["points"]:
        t = {name: p["by_c_tok"][c]["ratios"][name]["time_cpu_ms"] for name in ("none", "suffix", DEFAULT)}
        v = t[DEFAULT] / min(t["none"], t["suffix"])
        vs_best.append(v)
        row = (f"| `{p['name']}` | {page.set_what(p)} | {p['requests']:,} | {p['problems']:,} | "
               f"{t[DEFAULT] / t['none']:.2f} | **{v:.2f}** |")
        assert row in block, row
    mean = math.exp(sum(math.log(v) for v in vs_best) / len(vs_best))
    first = block.split("\n\n")[0]
    assert (f"Replaying {len(vs_best)} recorded rollout batches (table below), the default drafter's batch takes "
            f"{mean:.2f}x the time of the better of no speculation and vLLM's `suffix`") in first
    assert (f"range {min(vs_best):.2f}x to {max(vs_best):.2f}x, slower than that baseline on "
            f"{sum(v > 1 for v in vs_best)} of the {len(vs_best)}") in first
    assert "cost-model time, not GPU wall time" in first
    # the best point is only the end of the range: the only other ratios are the table's
    assert re.findall(r"\d\.\d\dx", first) == [f"{mean:.2f}x", f"{min(vs_best):.2f}x", f"{max(vs_best):.2f}x"]


def test_default_pages_are_the_ones_bench_page_sh_rewrites():
    """``das-trl bench page`` without ``--pages`` rewrites the same pages as ``scripts/bench_page.sh`` (the realdata
    sources table included), and those pages match the committed suite JSON."""
    root = Path(__file__).resolve().parents[1]
    script = (root / "scripts" / "bench_page.sh").read_text()
    pages = re.search(r"das-trl bench page --json \S+ --pages (.+?) --img", script).group(1).split()
    assert page.parse_args(["--json", "x"]).pages == pages
    argv = ["--json", str(root / "benchmarks" / "results" / "suite.json.gz"), "--no-figures", "--check", "--pages"]
    assert page.main(argv + [str(root / p) for p in pages]) == 0


def test_blocks_are_rewritten_and_check_fails_when_stale(payload, tmp_path, capsys):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(payload))
    md = tmp_path / "page.md"
    md.write_text("# Title\n\n<!-- bench:main-table:start -->\nold\n<!-- bench:main-table:end -->\n\nprose 1.23\n"
                  "<!-- bench:readme:start -->\n<!-- bench:readme:end -->\n")
    argv = ["--json", str(path), "--pages", str(md), "--img", str(tmp_path / "img")]
    assert page.main(argv + ["--check"]) == 1 and "old" in md.read_text()
    assert page.main(argv) == 0
    text = md.read_text()
    assert "old" not in text and "prose 1.23" in text and page.main_table(payload) in text
    assert "docs/img/bench_headline.png" in text
    assert page.main(argv + ["--check"]) == 0
    for png in ("bench_headline.png", "bench_by_set.png"):
        assert 0 < (tmp_path / "img" / png).stat().st_size < 150_000
    md.write_text(text + "<!-- bench:nope:start -->\n<!-- bench:nope:end -->\n")
    with pytest.raises(ValueError, match="unknown block"):
        page.main(argv + ["--check"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="no 'points'"):
        page.load(tmp_path / "bad.json")


def test_figures_skip_a_headline_without_traces(payload, tmp_path, capsys):
    for p in payload["points"]:
        for c in p["by_c_tok"].values():
            c.pop("traces")
    files = write_figures(payload, tmp_path)
    assert [f.rsplit("/", 1)[-1] for f in files] == ["bench_by_set.png"]
    # the page command says which linked figures this JSON cannot draw (an older file would stand in for them)
    path, md = tmp_path / "suite.json", tmp_path / "page.md"
    path.write_text(json.dumps(payload))
    md.write_text("<!-- bench:sets-table:start -->\n<!-- bench:sets-table:end -->\n")
    assert page.main(["--json", str(path), "--pages", str(md), "--img", str(tmp_path / "img")]) == 0
    err = capsys.readouterr().err
    assert "no data for" in err and "bench_headline.png" in err and "bench_by_set.png" not in err


def _result(speculative=True) -> ReplayResult:
    # 3 steps: 4, 4 -> 2 and 2 -> 0 running requests; per-step tokens, proposer CPU and background ingest.
    return ReplayResult("x", 4, 40, 10, 12, 8, 3, 0.0, batch_trace=[(0.0, 4), (1.0, 4), (2.0, 2), (3.0, 0)],
                        step_tokens=[10, 8, 4], proposer_seconds=[0.001, 0.0005, 0.002],
                        background_seconds=[0.0, 0.050, 0.0], speculative=speculative)


def test_running_trace_ends_at_the_time_with_the_cpu():
    r = _result()
    for c_tok, hs, off in ((0.025, 1.0, 0.0), (0.1, 2.0, 1.0)):
        tr = running_trace(r, 7.0, c_tok, hs, off)
        assert tr[0] == [0.0, 4] and tr[-1][1] == 0
        assert math.isclose(tr[-1][0], r.time_with_cpu(7.0, c_tok, hs, off), abs_tol=0.01)
        assert [b for _, b in tr] == [4, 2, 0]  # the unchanged step is thinned away
    assert running_trace(ReplayResult("y", 1, 1, 1, 0, 0, 1, 7.0), 7.0, 0.025) == []


def test_traces_are_thinned_and_oracle_text_ends_at_its_bound():
    lengths = list(range(1, 400))
    b = Bounds(0, 0, 0, max(-(-n // 17) for n in lengths), sum(-(-n // 17) for n in lengths), sum(lengths))
    tr = oracle_text_trace(lengths, 7.0, 0.025, 16, max_points=10)
    assert len(tr) <= 10 and tr[0] == [0.0, 399] and tr[-1][1] == 0
    assert math.isclose(tr[-1][0], b.text_time(7.0, 0.025), abs_tol=0.01)
    assert oracle_text_trace([0, 0], 7.0, 0.025, 16) == [[0.0, 0]]


def test_malformed_json_markers_and_pages_fail_clearly_and_write_nothing(payload, tmp_path, capsys):
    # Shapes the page cannot read are named (not a KeyError / TypeError from deep inside the tables).
    for breaks, says in ((lambda p: p["points"][0].pop("name"), "point 0 is not an object with a 'name'"),
                         (lambda p: p["points"].__setitem__(1, "x"), "point 1 is not an object"),
                         (lambda p: p["points"][1]["by_c_tok"]["0.1"].__setitem__("results", None), "'results' a list")):
        bad = json.loads(json.dumps(payload))
        breaks(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=says):
            page.load(tmp_path / "bad.json")
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(payload))
    good, broken = tmp_path / "good.md", tmp_path / "broken.md"
    good.write_text("<!-- bench:cost-table:start -->\nold\n<!-- bench:cost-table:end -->\n")
    # a block whose end marker names another block, and an upper-case name: both were left stale with exit 0
    for text in ("<!-- bench:main-table:start -->\nold\n<!-- bench:cost-table:end -->\n"
                 "<!-- bench:sets-table:start -->\n<!-- bench:sets-table:end -->\n",
                 "<!-- bench:Main-Table:start -->\n<!-- bench:Main-Table:end -->\n"
                 "<!-- bench:sets-table:start -->\n<!-- bench:sets-table:end -->\n"):
        broken.write_text(text)
        with pytest.raises(ValueError, match="not part of a"):
            page.main(["--json", str(path), "--pages", str(good), str(broken), "--no-figures"])
        assert "old" in good.read_text()  # every page is checked before any is written
    # a cost model one point lacks: the page says which it leaves out
    del payload["points"][0]["by_c_tok"]["0.1"]
    path.write_text(json.dumps(payload))
    assert page.main(["--json", str(path), "--pages", str(good), "--no-figures"]) == 0
    assert "cost model(s) 0.1 missing from some points" in capsys.readouterr().err
    # a point without the default's result is left out of the sentence (it read "-x") and counted as such
    del payload["points"][0]["by_c_tok"]["0.025"]["ratios"][DEFAULT]
    sentence = page.headline_sentence(payload)
    assert "-x" not in sentence and "Replaying 1 of 2 recorded rollout batches" in sentence
    for p in payload["points"]:
        p["by_c_tok"]["0.025"]["ratios"].pop(DEFAULT, None)
    assert "no result for the default drafter" in page.headline_sentence(payload)
