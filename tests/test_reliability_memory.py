"""Reliability case 1 at a small size: the history token budget holds, evictions are counted and oldest-first
(the full-size run is ``python -m das_trl.bench.history_memory`` with the flags in its docstring)."""

from __future__ import annotations

from das_trl.bench.history_memory import main, run


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
    assert "OK: budget held" in capsys.readouterr().out
