"""One line per logged step with the figures a DAS user watches, and a one-screen summary at the end of training.

Every figure comes from the run's own ``das/*`` metrics. Tokens per verification round is the hardware-independent
gain (a request needs that many times fewer engine rounds); rollout seconds are wall time, which on a CPU is not a
speed measure (verification tokens cost compute there).
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

_WIDTH = 88


def format_step(step: int, logs: dict[str, float]) -> str | None:
    """``str`` line for a training log dict (``None`` when it holds no rollout metrics)."""
    if "das/rollout_seconds" not in logs:
        return None
    flat = logs.get("frac_reward_zero_std")
    flat_text = f" ({flat:.0%} flat groups)" if flat is not None else ""
    return (
        f"[das-trl] step {step:>4} | reward {logs.get('reward', float('nan')):.3f}{flat_text} | "
        f"rollout {logs['das/rollout_seconds']:.1f}s (+ weight sync {logs.get('das/weight_sync_seconds', 0):.1f}s) | "
        f"tokens/round {logs.get('das/tokens_per_round', 1.0):.2f} | "
        f"drafts: {logs.get('das/draft_tokens', 0):.0f} proposed, {logs.get('das/accepted_tokens', 0):.0f} accepted | "
        f"history {logs.get('das/history_problems', 0):.0f} problems / {logs.get('das/history_tokens', 0):.0f} tokens"
    )


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def reward_slope(rewards: list[float]) -> float | None:
    """Least-squares slope of the mean reward per step (reward units per step); ``None`` with fewer than two finite
    values."""
    points = [(i, r) for i, r in enumerate(rewards) if not math.isnan(r)]
    if len(points) < 2:
        return None
    mx = sum(i for i, _ in points) / len(points)
    my = sum(r for _, r in points) / len(points)
    sxx = sum((i - mx) ** 2 for i, _ in points)
    return sum((i - mx) * (r - my) for i, r in points) / sxx


def format_summary(history: list[dict[str, float]], steps: list[int] | None = None, cpu: bool | None = None) -> str:
    """The end-of-run summary (one screen, at most ~15 lines) from the logged ``das/*`` metrics of each step, with
    the reward trend (first step, last third, least-squares slope) and the share of groups whose rewards were all equal
    (TRL's ``frac_reward_zero_std``: no advantage, no gradient).

    Args:
        history: one log dict per logged step, in order (each with ``das/rollout_seconds``).
        steps: the global step of each entry (default 1..n).
        cpu: whether the engine ran on a CPU build (adds the wall-time caveat); ``None`` detects it.

    Returns:
        Multi-line ``str``.

    Raises:
        ValueError: ``history`` is empty.
    """
    if not history:
        raise ValueError("no DAS step metrics to summarise")
    steps = steps or list(range(1, len(history) + 1))
    if cpu is None:
        try:
            from das_trl.vllm.engine import is_cpu_build

            cpu = is_cpu_build()
        except Exception:  # noqa: BLE001 - the caveat is informational
            cpu = True
    n = len(history)
    tail = max(1, n // 3)  # "last steps": the final third of the run (history has built up by then)
    get = lambda key, default=0.0: [float(h.get(key, default)) for h in history]  # noqa: E731
    rounds = get("das/tokens_per_round", 1.0)
    drafted, accepted = sum(get("das/draft_tokens")), sum(get("das/accepted_tokens"))
    rollout, sync = sum(get("das/rollout_seconds")), sum(get("das/weight_sync_seconds"))
    rewards = get("reward", float("nan"))
    last = history[-1]
    first_tpr, last_tpr = rounds[0], _mean(rounds[-tail:])
    lines = [
        f"[das-trl] {'=' * 30} DAS run summary {'=' * 30}",
        f"  steps logged              {n} (steps {steps[0]}-{steps[-1]})",
        f"  tokens per round          first step {first_tpr:.2f} -> last {tail} step(s) {last_tpr:.2f}"
        f" (run mean {_mean(rounds):.2f})",
        f"  engine rounds per token   {1 / last_tpr:.2f} at the end (1.00 without drafting): "
        f"{last_tpr:.2f}x fewer verification rounds",
        f"  draft tokens              {drafted:,.0f} proposed, {accepted:,.0f} accepted "
        f"({accepted / drafted if drafted else 0:.1%})",
        f"  rounds with a draft       {_mean(get('das/speculated_share')):.1%} of request-rounds (mean over steps)",
        f"  rollout time              {rollout:,.1f} s in all, {rollout / n:,.1f} s/step "
        f"(+ weight sync {sync:,.1f} s)",
        f"  history at the end        {last.get('das/history_problems', 0):,.0f} problems, "
        f"{last.get('das/history_tokens', 0):,.0f} tokens",
    ]
    if not all(math.isnan(r) for r in rewards):
        slope = reward_slope(rewards)
        trend = f" (least-squares trend {slope:+.3f}/step)" if slope is not None else ""
        lines.append(f"  reward                    first step {rewards[0]:.3f} -> last {tail} step(s) "
                     f"{_mean(rewards[-tail:]):.3f}{trend}")
    flat = [float(h["frac_reward_zero_std"]) for h in history if "frac_reward_zero_std" in h]
    if flat:
        lines.append(f"  groups w/o reward spread  {_mean(flat):.1%} of groups (mean over steps; GRPO learns nothing "
                     f"from them), last step {flat[-1]:.0%}")
    if cpu:
        lines.append("  note: CPU engine. Rollout seconds are not a speed measure here (verification tokens cost "
                     "compute);")
        lines.append("        tokens per round is the hardware-independent gain.")
    lines.append(f"[das-trl] {'=' * 77}")
    return "\n".join(lines)


class DASProgressCallback(TrainerCallback):
    """Prints :func:`format_step` for each log on the main process, and :func:`format_summary` at ``on_train_end``."""

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []
        self.steps: list[int] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any):
        line = format_step(state.global_step, logs or {})
        if line is not None and state.is_world_process_zero:
            self.history.append(dict(logs))
            self.steps.append(state.global_step)
            print(line, flush=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        if not self.history or not state.is_world_process_zero:
            return
        print(format_summary(self.history, self.steps), flush=True)
