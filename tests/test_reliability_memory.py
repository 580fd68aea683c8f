"""Reliability case 1 at a small size: the history token budget holds, evictions are counted and oldest-first
(the full-size run is ``python -m das_trl.bench.micro.history_memory`` with the flags in its docstring)."""

from __future__ import annotations

import pytest

from das_trl.bench.micro.history_memory import main, run


def test_budget_holds_evictions_counted_oldest_first():
    result = run(problems=24, samples=4, appearances=5, length=48, window=16, budget=6_000, problems_per_step=8)
    assert result["pushed_tokens"] > 3 * result["budget"]  # the budget really had to evict
    assert result["budget_held"] and result["max_history_tokens"] <= 6_000
    assert result["history_tokens"] > 6_000 - 4 * 48 * 2  # and it is not emptied either: within ~one appearance
    assert result["evicted_appearances"] == result["pushed_appearances"] - result["history_appearances"] > 0
    assert result["evictions_counted"] and result["oldest_first"]
    assert result["rss_final_bytes"] > 0 and result["digest_seconds"] >= 0


def test_window_smaller_than_appearances_still_bounded():
    result = run(problems=6, samples=2, appearances=6, length=16, window=2, budget=10**6, problems_per_step=6)
    assert result["history_appearances"] == 6 * 2  # the window, not the budget, evicted
    assert result["evictions_counted"] and result["oldest_first"]


def test_command_line_exit_code(capsys):
    assert main(["--problems", "4", "--samples", "2", "--appearances", "2", "--length", "16", "--budget", "50"]) == 0
    out = capsys.readouterr().out
    assert "OK: budget held" in out and "native core, depth 64" in out  # the engine's drafter, not the reference


def test_recorded_rollouts_are_pushed_step_by_step_within_the_budget(capsys, tmp_path):
    from pathlib import Path

    from das_trl.bench.micro.history_memory import run_recorded
    from das_trl.drafter.rollout_log import read_records

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sets" / "grpo_smollm2_products.jsonl.gz"
    records = list(read_records(path))
    result = run_recorded(str(path), budget=1_000)
    assert result["steps"] == len({r.step for r in records})
    assert result["pushed_tokens"] == sum(len(r.completion_ids) for r in records) > 3 * 1_000
    assert result["budget_held"] and 0 < result["history_tokens"] <= 1_000
    assert result["max_tree_depth"] == 64 and result["bytes_per_history_token"] > 0
    assert main(["--rollouts", str(path)]) == 0 and "OK: budget held" in capsys.readouterr().out
    assert main(["--rollouts", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["python", "native"])
def test_live_pool_bounded_by_token_budget_without_pushes(backend):
    """The live pool's input of docs/reliability.md, scaled down: requests finish and are never pushed into the
    history; the finished outputs in the sibling/batch trees stay within live_token_budget, and so does the process's
    RSS growth."""
    import json
    import subprocess
    import sys

    from das_trl.drafter.config import LIVE_TREE_BYTES_PER_TOKEN

    requests, prompt, output, budget = 300, 64, 500, 20_000
    # A fresh process: RSS growth is not hidden by (or blamed on) memory freed by earlier tests.
    cmd = [sys.executable, "-m", "das_trl.bench.micro.live_memory", "--requests", str(requests), "--prompt",
           str(prompt), "--output", str(output), "--budget", str(budget), "--backend", backend]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    stats = result["stats"]
    assert result["input_tokens"] > 5 * budget  # the budget really had to evict
    assert result["max_finished_tokens"] <= budget and stats["live_finished_tokens"] <= budget
    assert stats["live_evicted_outputs"] > 0 and stats["live_running_tokens"] == 0
    # Most the trees can hold: finished outputs (prompt tail + output, in the sibling and the batch tree) within the
    # budget, plus the one running request (local tree: prompt + output; sibling and batch: tail + output).
    tail = 32
    max_tree_tokens = 2 * (budget + tail + output) + (prompt + output) + 2 * (tail + output)
    assert result["peak_live_tree_tokens"] <= max_tree_tokens
    # RSS: 1.5x the per-token figure for allocator slack, plus 32 MiB. Without the budget this input held ~320k tree
    # tokens (~125 MB), well above the bound (~60 MB).
    bound = 1.5 * LIVE_TREE_BYTES_PER_TOKEN * max_tree_tokens + 32 * 2**20
    assert result["rss_growth_bytes"] < bound, (result["rss_growth_bytes"], bound)
