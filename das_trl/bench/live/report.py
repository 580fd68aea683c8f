"""The live A/B's report: per drafter, what the engine did with the batch (steps, vLLM's draft counters, tokens per
round overall and per length tier, completion steps, greedy identity with ``none``, the checks that failed), as a
table, JSON objects and a plot of finished requests over engine steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from das_trl.bench.live.config import LiveConfig
from das_trl.bench.live.engine import BatchResult

WALL_TIME_NOTE = ("CPU wall time: NOT a speed claim (a CPU is compute-bound, so verifying draft tokens costs real "
                  "time); judge drafting by engine steps and tokens per round")
TIERS_NOTE = ("length tiers rank each run's requests by their own final length: top 20% long, next 40% medium, "
              "rest short")


@dataclass
class DrafterReport:
    """Everything reported for one drafter (the JSON ``results[i]`` object)."""

    drafter: str
    num_speculative_tokens: int
    engine_steps: int
    requests: int
    output_tokens: int
    request_rounds: int
    tokens_per_round: float
    tokens_per_round_by_tier: dict[str, float]
    spec_decode: dict[str, Any]
    completion_step: dict[str, Any]
    finished_by_step: list[int]
    wall_seconds: float
    speculation_ran: bool | None
    logprobs_complete: bool
    identical_to_none: bool | None = None
    mismatched_requests: int | None = None
    max_abs_logprob_diff_vs_none: float | None = None
    timed_out: bool = False
    das_stats: dict[str, Any] | None = None
    history_push: dict[str, Any] | None = None
    async_scheduling: bool | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def length_tier_tokens_per_round(lengths: Sequence[int], rounds: Sequence[int]) -> dict[str, float | None]:
    """Tokens per verification round per length tier (tiers: :func:`das_trl.bench.report.length_tiers`)."""
    from das_trl.bench.report import length_tiers

    tiers = length_tiers(lengths)
    out: dict[str, float | None] = {}
    for t, name in enumerate(("short", "medium", "long")):
        mask = tiers == t
        r = int(np.asarray(rounds)[mask].sum())
        out[name] = float(np.asarray(lengths)[mask].sum() / r) if r else None
    return out


def make_report(drafter: str, cfg: LiveConfig, batch: BatchResult, spec: dict[str, Any],
                reference: BatchResult | None, expect_drafts: bool = True) -> DrafterReport:
    """Summarise one drafter's :class:`BatchResult`.

    Args:
        reference: the ``none`` run, for the greedy identity check (``None``: not checked).
        expect_drafts: whether the drafter is known to have had something to draft from (history, or proposals its
            own counters saw). Zero draft tokens counted by vLLM is then an error (a silent fallback to no-SD);
            otherwise only a note (``ngram`` may find no repeated n-gram).
    """
    lengths = [len(t) for t in batch.tokens]
    total_rounds = int(sum(batch.rounds))
    finish = np.asarray(batch.finish_step)
    finished_by_step = np.bincount(finish[finish > 0], minlength=batch.engine_steps + 1).cumsum()[1:].tolist()
    report = DrafterReport(
        drafter=drafter,
        num_speculative_tokens=0 if drafter == "none" else cfg.num_speculative_tokens,
        engine_steps=batch.engine_steps,
        requests=len(lengths),
        output_tokens=int(sum(lengths)),
        request_rounds=total_rounds,
        tokens_per_round=sum(lengths) / total_rounds if total_rounds else math.nan,
        tokens_per_round_by_tier=length_tier_tokens_per_round(lengths, batch.rounds),
        spec_decode=spec,
        completion_step={"p50": float(np.percentile(finish, 50)), "p90": float(np.percentile(finish, 90)),
                         "max": int(finish.max()) if finish.size else 0, "per_request": finish.tolist()},
        finished_by_step=finished_by_step,
        wall_seconds=batch.wall_seconds,
        speculation_ran=None if drafter == "none" else spec["num_draft_tokens"] > 0,
        logprobs_complete=all(len(lp) == len(t) and all(v is not None for v in lp)
                              for lp, t in zip(batch.logprobs, batch.tokens)),
        timed_out=batch.timed_out,
    )
    if drafter != "none" and not report.speculation_ran and not expect_drafts:
        report.notes.append(f"{drafter}: proposed no draft tokens (nothing to draft from)")
    elif drafter != "none" and not report.speculation_ran:
        report.errors.append(f"{drafter}: speculation did not run (vLLM counted 0 draft tokens while logprobs were "
                             "requested): a silent fallback to no-SD")
    if not report.logprobs_complete:
        report.errors.append(f"{drafter}: some sampled tokens came back without a logprob")
    if batch.timed_out:
        report.errors.append(f"{drafter}: hit the time limit; unfinished requests were aborted")
    if cfg.greedy and reference is not None and drafter != "none":
        mism = sum(a != b for a, b in zip(batch.tokens, reference.tokens))
        report.identical_to_none = mism == 0
        report.mismatched_requests = int(mism)
        diffs = [abs(a - b) for x, y in zip(batch.logprobs, reference.logprobs) for a, b in zip(x, y)
                 if a is not None and b is not None]
        report.max_abs_logprob_diff_vs_none = max(diffs) if diffs else None
        if mism:
            report.errors.append(f"{drafter}: {mism} greedy outputs differ from no-SD")
    return report


def format_table(reports: Sequence[DrafterReport], cpu: bool) -> str:
    """A fixed-width table of the reports (one row per drafter)."""
    base = next((r for r in reports if r.drafter == "none"), None)
    wall = "CPU wall s*" if cpu else "wall s"
    head = (f"{'drafter':<8}{'steps':>7}{'vs none':>8}{'tok/round':>10}{'short':>7}{'medium':>7}{'long':>7}"
            f"{'drafts':>8}{'draft tok':>10}{'accepted':>9}{'acc rate':>9}{'acc len':>8}{'tail p90':>9}"
            f"{'tail max':>9}{wall:>12}{'greedy==none':>13}{'sched':>7}")
    lines = [head, "-" * len(head)]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    for r in reports:
        s = r.spec_decode
        vs = f"{r.engine_steps / base.engine_steps:.2f}" if base and base.engine_steps else "-"
        t = r.tokens_per_round_by_tier
        ident = "-" if r.identical_to_none is None else ("yes" if r.identical_to_none else
                                                         f"NO ({r.mismatched_requests})")
        sched = "-" if r.async_scheduling is None else ("async" if r.async_scheduling else "sync")
        lines.append(
            f"{r.drafter:<8}{r.engine_steps:>7d}{vs:>8}{r.tokens_per_round:>10.3f}{num(t['short'], '.2f'):>7}"
            f"{num(t['medium'], '.2f'):>7}{num(t['long'], '.2f'):>7}{s['num_drafts']:>8d}{s['num_draft_tokens']:>10d}"
            f"{s['num_accepted_tokens']:>9d}{num(s['acceptance_rate'], '.3f'):>9}"
            f"{num(s['mean_acceptance_length'], '.2f'):>8}{r.completion_step['p90']:>9.0f}"
            f"{r.completion_step['max']:>9d}{r.wall_seconds:>12.1f}{ident:>13}{sched:>7}")
    lines.append("sched: the engine's scheduling (drafting engines run sync, as vLLM requires; none runs with vLLM's "
                 "default: async on GPUs, sync on the CPU build)")
    if cpu:
        lines.append(f"* {WALL_TIME_NOTE}")
    return "\n".join(lines)


def write_plot(reports: Sequence[DrafterReport], path: str | Path) -> str:
    """PNG of finished requests over engine steps, one line per drafter; returns the file's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in reports:
        ax.step(np.arange(1, len(r.finished_by_step) + 1), r.finished_by_step, where="post", label=r.drafter)
    ax.set_xlabel("engine step (forward pass)")
    ax.set_ylabel("finished requests")
    ax.set_title("Rollout batch: finished requests over engine steps")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
