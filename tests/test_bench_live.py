"""`das-trl bench live` end to end on real CPU vLLM engines, at the smallest greedy size.

One run of none, suffix and DAS (ngram is left to the documented command, to keep this under ~3 minutes of CI: each
engine costs a process start and an engine build), one engine at a time: greedy outputs must be token-identical to
no-SD, DAS and suffix must draft from the pushed history and have drafts accepted, and the JSON must hold the
documented fields. Also unit checks of the counter arithmetic and the sampling warnings (no engine).
"""

from __future__ import annotations

import json

import pytest

from das_trl.bench import live

RESULT_FIELDS = {"drafter", "num_speculative_tokens", "engine_steps", "requests", "output_tokens", "request_rounds",
                 "tokens_per_round", "tokens_per_round_by_tier", "spec_decode", "completion_step",
                 "finished_by_step", "wall_seconds", "speculation_ran", "logprobs_complete", "identical_to_none",
                 "mismatched_requests", "max_abs_logprob_diff_vs_none", "errors"}
SPEC_FIELDS = {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos", "acceptance_rate",
               "acceptance_rate_per_pos", "mean_acceptance_length"}


def test_counter_delta_subtracts_and_derives_rates():
    before = {"num_drafts": 2, "num_draft_tokens": 10, "num_accepted_tokens": 4, "accepted_per_pos": [2, 1]}
    after = {"num_drafts": 6, "num_draft_tokens": 30, "num_accepted_tokens": 10, "accepted_per_pos": [5, 3, 1]}
    d = live.counter_delta(after, before)
    assert (d["num_drafts"], d["num_draft_tokens"], d["num_accepted_tokens"]) == (4, 20, 6)
    assert d["accepted_per_pos"] == [3, 2, 1]
    assert d["acceptance_rate"] == pytest.approx(0.3)
    assert d["acceptance_rate_per_pos"] == pytest.approx([0.75, 0.5, 0.25])
    assert d["mean_acceptance_length"] == pytest.approx(2.5)
    empty = live.counter_delta(before, before)
    assert empty["acceptance_rate"] is None and empty["mean_acceptance_length"] is None


def test_sampling_warnings_flag_what_disables_speculation():
    from vllm import SamplingParams

    spec = {"method": "ngram", "num_speculative_tokens": 4}
    ok = live.sampling_params(0.8, 16)
    assert live.sampling_warnings(ok, spec, 32) == []
    assert live.sampling_warnings(SamplingParams(min_p=0.1), None, 32) == []  # no speculation, nothing to warn
    assert any("min_p" in w for w in live.sampling_warnings(SamplingParams(min_p=0.1), spec, 32))
    assert any("disable_by_batch_size" in w
               for w in live.sampling_warnings(ok, dict(spec, disable_by_batch_size=8), 32))


def test_report_catches_silent_fallback_and_greedy_mismatch():
    ref = live.BatchResult([[1, 2, 3]], [[-0.1, -0.2, -0.3]], [3], [3], 3, 1.0)
    same = live.BatchResult([[1, 2, 3]], [[-0.1, -0.2, -0.3]], [3], [3], 3, 1.0)
    zero = live.counter_delta({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}, {})
    cfg = live.LiveConfig(greedy=True, num_speculative_tokens=4)
    report = live.make_report("das", cfg, same, zero, ref)
    assert report.speculation_ran is False
    assert any("silent fallback" in e for e in report.errors)
    quiet = live.make_report("ngram", cfg, same, zero, ref, expect_drafts=False)
    assert quiet.errors == [] and quiet.notes and quiet.identical_to_none is True
    other = live.BatchResult([[1, 2, 4]], [[-0.1, -0.2, -0.3]], [2], [2], 2, 1.0)
    drafted = live.counter_delta({"num_drafts": 1, "num_draft_tokens": 2, "num_accepted_tokens": 1}, {})
    report = live.make_report("ngram", cfg, other, drafted, ref)
    assert report.identical_to_none is False and report.mismatched_requests == 1
    assert any("differ from no-SD" in e for e in report.errors)


@pytest.mark.engine
def test_live_greedy_identical_and_das_accepts(model_path, tmp_path):
    out = tmp_path / "live"
    rc = live.main(["--model", model_path, "--drafters", "none,suffix,das", "--greedy", "--prompts", "2",
                    "--samples", "2", "--max-tokens", "16", "--warm-epochs", "1", "--num-speculative-tokens", "8", "--max-model-len", "512",
                    "--kv-cache-bytes", str(256 * 1024**2), "--out", str(out)])
    result = json.loads((out / "live.json").read_text())
    assert rc == 0, result["errors"]
    assert result["ok"] is True
    assert (out / "live.png").stat().st_size > 0
    assert {"config", "platform", "vllm_version", "wall_time_note", "tiers_note", "history", "warnings",
            "results", "errors"} <= set(result)
    by_name = {r["drafter"]: r for r in result["results"]}
    assert list(by_name) == ["none", "suffix", "das"]
    none = by_name["none"]
    assert none["spec_decode"]["num_draft_tokens"] == 0
    assert none["engine_steps"] >= 16  # 16 tokens, one per step, plus nothing to speed it up
    for r in result["results"]:
        assert RESULT_FIELDS <= set(r), r.keys()
        assert r["async_scheduling"] is False  # the engine's own setting; the CPU build forces sync scheduling
        assert SPEC_FIELDS <= set(r["spec_decode"])
        assert r["requests"] == 4 and r["logprobs_complete"] is True
        assert set(r["tokens_per_round_by_tier"]) == {"short", "medium", "long"}
        assert len(r["completion_step"]["per_request"]) == 4
        assert r["finished_by_step"][-1] == 4
    for name in ("suffix", "das"):  # both drafted from the pushed history
        assert by_name[name]["identical_to_none"] is True, name
        assert by_name[name]["speculation_ran"] is True, name
    das = by_name["das"]
    assert das["spec_decode"]["num_accepted_tokens"] > 0
    assert das["das_stats"]["attached"] is True and das["das_stats"]["history_problems"] == 2
    assert das["engine_steps"] < none["engine_steps"]
    assert das["tokens_per_round"] > 1.0
    assert by_name["suffix"]["history_push"]["added"] == 4
