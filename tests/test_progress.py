"""The end-of-training summary: one screen of figures from the run's own das/* metrics."""

from __future__ import annotations

import pytest

from das_trl.trainer.progress import DASProgressCallback, format_step, format_summary, reward_slope


def _logs(tpr: float, accepted: float) -> dict[str, float]:
    return {"das/rollout_seconds": 10.0, "das/weight_sync_seconds": 1.0, "das/tokens_per_round": tpr,
            "das/draft_tokens": 100.0, "das/accepted_tokens": accepted, "das/speculated_share": 0.5,
            "das/history_problems": 2.0, "das/history_tokens": 500.0, "reward": 0.25}


def test_summary_reports_first_vs_last_steps_and_totals():
    history = [_logs(1.1, 10), _logs(1.2, 20), _logs(1.4, 40), _logs(1.6, 60)]
    text = format_summary(history, cpu=True)
    lines = text.splitlines()
    assert len(lines) <= 20 and all(len(line) <= 110 for line in lines)
    assert "first step 1.10 -> last 1 step(s) 1.60" in text
    assert "1.60x fewer verification rounds" in text
    assert "400 proposed, 130 accepted (32.5%)" in text
    assert "40.0 s in all, 10.0 s/step (+ weight sync 4.0 s)" in text
    assert "2 problems, 500 tokens" in text
    assert "not a speed measure" in text
    assert "not a speed measure" not in format_summary(history, cpu=False)
    with pytest.raises(ValueError):
        format_summary([])


def test_summary_reports_reward_trend_and_flat_groups():
    history = [dict(_logs(1.2, 10), reward=r, frac_reward_zero_std=f)
               for r, f in ((0.30, 0.5), (0.40, 0.25), (0.50, 0.25), (0.60, 0.0))]
    text = format_summary(history, cpu=True)
    assert "first step 0.300 -> last 1 step(s) 0.600 (least-squares trend +0.100/step)" in text
    assert "25.0% of groups" in text and "last step 0%" in text
    assert "(50% flat groups)" in format_step(1, history[0])
    assert reward_slope([0.5]) is None and reward_slope([float("nan"), 1.0, 2.0]) == pytest.approx(1.0)


def test_callback_prints_steps_and_summary(capsys):
    class State:
        global_step = 0
        is_world_process_zero = True

    callback, state = DASProgressCallback(), State()
    for step, tpr in enumerate((1.0, 1.5), start=1):
        state.global_step = step
        callback.on_log(None, state, None, logs=_logs(tpr, 5))
    callback.on_log(None, state, None, logs={"loss": 0.1})  # no rollout metrics: ignored
    callback.on_train_end(None, state, None)
    out = capsys.readouterr().out
    assert out.count("[das-trl] step") == 2 and "DAS run summary" in out and "steps 1-2" in out
    assert format_step(3, {"loss": 1.0}) is None
