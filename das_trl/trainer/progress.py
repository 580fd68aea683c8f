"""One line per logged step with the figures a DAS user watches, and a summary at the end of training."""

from __future__ import annotations

from transformers import TrainerCallback


def format_step(step: int, logs: dict[str, float]) -> str | None:
    """``str`` line for a training log dict (``None`` when it holds no rollout metrics)."""
    if "das/rollout_seconds" not in logs:
        return None
    return (
        f"[das-trl] step {step:>4} | reward {logs.get('reward', float('nan')):.3f} | "
        f"rollout {logs['das/rollout_seconds']:.1f}s (+ weight sync {logs.get('das/weight_sync_seconds', 0):.1f}s) | "
        f"tokens/round {logs.get('das/tokens_per_round', 1.0):.2f} | "
        f"drafts: {logs.get('das/draft_tokens', 0):.0f} proposed, {logs.get('das/accepted_tokens', 0):.0f} accepted | "
        f"history {logs.get('das/history_problems', 0):.0f} problems / {logs.get('das/history_tokens', 0):.0f} tokens"
    )


class DASProgressCallback(TrainerCallback):
    """Prints :func:`format_step` for each log on the main process, and a summary at ``on_train_end``."""

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = format_step(state.global_step, logs or {})
        if line is not None and state.is_world_process_zero:
            self.history.append(dict(logs))
            print(line, flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if not self.history or not state.is_world_process_zero:
            return
        drafted = sum(h.get("das/draft_tokens", 0) for h in self.history)
        accepted = sum(h.get("das/accepted_tokens", 0) for h in self.history)
        rounds = [h.get("das/tokens_per_round", 1.0) for h in self.history]
        print(
            f"[das-trl] summary: {len(self.history)} steps | draft tokens {drafted:.0f}, accepted {accepted:.0f} "
            f"({accepted / drafted if drafted else 0:.1%}) | tokens/round first {rounds[0]:.2f}, last {rounds[-1]:.2f}, "
            f"mean {sum(rounds) / len(rounds):.2f} | rollout seconds total "
            f"{sum(h['das/rollout_seconds'] for h in self.history):.0f} (CPU wall time: not a speed claim)",
            flush=True,
        )
