"""The replay's report: tables, JSON and plots, for one replay (``das-trl bench replay``) and for a suite of them
(``das-trl bench suite``). A new metric is a field of :class:`~das_trl.bench.simulation.ReplayResult` plus a column
here.

Replay table: per drafter, tokens per verification round (emitted tokens / request-rounds) and its ratio to
``suffix``, verification (draft) tokens per accepted draft token, forward passes per request (mean), tail forward
passes (the most any request needed = the batch's step count) and its ratio to ``none``, the simulated rollout time
(ms) and the speedup over ``none``; then tokens per round by length tier.

Suite table: per replay point, drafter and cost model, ``tok/round vs suffix``, ``tail vs none``, ``time vs best``
(cost-model time relative to the better of ``none`` and ``suffix``) and the drafter's own CPU time per request-round
(``us/req-round``, and ``vs suffix``); then one summary line per point, before (:data:`BEFORE`) -> after
(:data:`AFTER`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from das_trl.bench.simulation import ReplayResult

if TYPE_CHECKING:
    from das_trl.bench.suite import Point

#: What the trainer ran by default before the controller (``tiers``) and what it runs now.
BEFORE, AFTER = "das+policy", "das+controller"


# ---------------------------------------------------------------------------- one replay
def length_tiers(lengths: Sequence[int], long_fraction=0.2, medium_fraction=0.4) -> np.ndarray:
    """Tier per eval request by its own recorded length (0 short, 1 medium, 2 long; top 20% long, next 40%)."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    tiers = np.zeros(len(lengths), dtype=np.int64)
    nl = int(round(long_fraction * len(lengths)))
    nm = int(round(medium_fraction * len(lengths)))
    tiers[order[:nl]] = 2
    tiers[order[nl:nl + nm]] = 1
    return tiers


def tier_tokens_per_round(res: ReplayResult) -> dict[str, float]:
    tiers = length_tiers(res.lengths)
    out = {}
    for t, name in enumerate(("short", "medium", "long")):
        m = tiers == t
        p = np.asarray(res.passes)[m].sum()
        out[name] = float(np.asarray(res.lengths)[m].sum() / p) if p else math.nan
    return out


def format_table(results: Sequence[ReplayResult], baseline: str = "none", reference: str = "suffix") -> str:
    base = next((r for r in results if r.name == baseline), None)
    ref = next((r for r in results if r.name == reference), None)
    head = (f"{'drafter':<14}{'tok/round':>10}{'vs suffix':>10}{'draft/acc':>10}{'passes/req':>11}"
            f"{'tail':>7}{'tail/none':>10}{'sim ms':>10}{'speedup':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        vs = f"{r.tokens_per_round / ref.tokens_per_round:.2f}x" if ref else "-"
        dpa = f"{r.draft_per_accepted:.2f}" if not math.isnan(r.draft_per_accepted) else "-"
        tail = f"{r.steps / base.steps:.2f}" if base else "-"
        sp = f"{base.sim_time_ms / r.sim_time_ms:.2f}x" if base else "-"
        lines.append(f"{r.name:<14}{r.tokens_per_round:>10.3f}{vs:>10}{dpa:>10}{r.mean_passes:>11.1f}"
                     f"{r.steps:>7d}{tail:>10}{r.sim_time_ms:>10.0f}{sp:>9}")
    return "\n".join(lines)


def write_plots(results: Sequence[ReplayResult], outdir: str | Path, history_lengths: Sequence[int]) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    files = []
    lengths = results[0].lengths
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.linspace(0, max(max(lengths), max(history_lengths, default=1)) + 1, 40)
    ax.hist(history_lengths, bins=bins, alpha=0.5, label="history epochs", density=True)
    ax.hist(lengths, bins=bins, alpha=0.5, label="replayed epoch", density=True)
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("density")
    ax.legend()
    ax.set_title("Rollout length distribution")
    files.append(_save(fig, outdir / "length_distribution.png"))

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(results)
    for j, r in enumerate(results):
        tpr = tier_tokens_per_round(r)
        ax.bar(np.arange(3) + j * width, [tpr[k] for k in ("short", "medium", "long")], width, label=r.name)
    ax.set_xticks(np.arange(3) + 0.4 - width / 2, ["short (bottom 40%)", "medium", "long (top 20%)"])
    ax.set_ylabel("tokens per verification round")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Tokens per round by length tier")
    files.append(_save(fig, outdir / "tokens_per_round_by_tier.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        if r.name in ("none", "suffix", "das+policy", "das+cost", "das+controller") or r.name == results[-1].name:
            t, b = zip(*r.batch_trace)
            ax.step(np.asarray(t) / 1000.0, b, where="post", label=r.name)
    ax.set_xlabel("simulated time (s, cost model)")
    ax.set_ylabel("running requests")
    ax.legend()
    ax.set_title("Batch size over time")
    files.append(_save(fig, outdir / "batch_size_over_time.png"))
    return files


def _save(fig, path: Path) -> str:
    """Write a figure as PNG, close it, and return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def format_tiers(results: Sequence[ReplayResult]) -> str:
    """Tokens per round by length tier, one line per drafter."""
    lines = ["tokens/round by length tier (eval requests ranked by their own length):"]
    for r in results:
        tpr = tier_tokens_per_round(r)
        lines.append(f"  {r.name:<16}" + "  ".join(f"{k} {v:.3f}" for k, v in tpr.items()))
    return "\n".join(lines)


def write_replay_json(path: str | Path, settings: dict, results: Sequence[ReplayResult]) -> None:
    """Write one replay's ``settings`` and every result (summary and length tiers) as JSON."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    payload = dict(settings, results=[dict(r.summary(), tiers=tier_tokens_per_round(r)) for r in results])
    Path(path).write_text(json.dumps(payload, indent=2, default=float))


# ---------------------------------------------------------------------------- a suite of replays
def ratios(results: Sequence[ReplayResult], c_base: float, c_tok: float) -> dict[str, dict[str, float]]:
    """Per drafter: ``tpr_vs_suffix``, ``tail_vs_none``, ``time_vs_best`` (better of none and suffix),
    ``time_ms``, ``us_per_round`` and ``us_vs_suffix`` (nan where a reference drafter is missing)."""
    by = {r.name: r for r in results}
    none, suffix = by.get("none"), by.get("suffix")
    refs = [r.time_at(c_base, c_tok) for r in (none, suffix) if r is not None]
    best = min(refs) if refs else math.nan
    sfx_us = 1e6 * suffix.drafter_seconds / max(1, suffix.rounds) if suffix else math.nan
    out = {}
    for r in results:
        us = 1e6 * r.drafter_seconds / max(1, r.rounds)
        t = r.time_at(c_base, c_tok)
        out[r.name] = {"tokens_per_round": r.tokens_per_round,
                       "tpr_vs_suffix": r.tokens_per_round / suffix.tokens_per_round if suffix else math.nan,
                       "tail": r.steps, "tail_vs_none": r.steps / none.steps if none else math.nan,
                       "time_ms": t, "time_vs_best": t / best, "us_per_round": us,
                       "us_vs_suffix": us / sfx_us if sfx_us > 0 else math.nan}
    return out


def format_point(point: Point, c_base: float, c_tok: float) -> str:
    """The table block of one replay point under one cost model."""
    res = point.results[c_tok]
    rat = ratios(res, c_base, c_tok)
    head = (f"{'drafter':<16}{'tok/round':>10}{'vs suffix':>10}{'tail':>7}{'vs none':>8}{'time ms':>10}"
            f"{'vs best':>8}{'us/req-rd':>10}{'vs suffix':>10}")
    lines = [f"{point.name}: {point.requests} requests, {point.problems} problems, {point.tokens} tokens, replaying "
             f"appearance {point.eval_epoch} after {len(point.history_epochs)}; cost model {c_base} ms + {c_tok} "
             f"ms/token", head, "-" * len(head)]
    for r in res:
        x = rat[r.name]
        lines.append(f"{r.name:<16}{x['tokens_per_round']:>10.3f}{_x(x['tpr_vs_suffix'])}{x['tail']:>7d}"
                     f"{_f(x['tail_vs_none'], 8)}{x['time_ms']:>10.0f}{_f(x['time_vs_best'], 8)}"
                     f"{x['us_per_round']:>10.1f}{_x(x['us_vs_suffix'])}")
    return "\n".join(lines)


def format_summary(points: Sequence[Point], c_base: float, c_toks: Sequence[float]) -> str:
    """One line per replay point and cost model: suffix's tokens/round, then before (``das+policy``, the old
    default) -> after (``das+controller``) for the four ratios."""
    head = (f"{'set':<34}{'c_tok':>6}{'suffix t/r':>11}  {'t/r vs suffix':>14}  {'tail vs none':>13}  "
            f"{'time vs best':>13}  {'us vs suffix':>13}")
    lines = [f"before = {BEFORE} (old trainer default, tiers) -> after = {AFTER} (new default)", head,
             "-" * len(head)]
    for c_tok in c_toks:
        for p in points:
            rat = ratios(p.results[c_tok], c_base, c_tok)
            b, a, s = rat.get(BEFORE), rat.get(AFTER), rat.get("suffix")
            cells = []
            for key, fmt in (("tpr_vs_suffix", "{:.2f}x"), ("tail_vs_none", "{:.2f}"), ("time_vs_best", "{:.3f}"),
                             ("us_vs_suffix", "{:.1f}x")):
                before = fmt.format(b[key]) if b else "-"
                after = fmt.format(a[key]) if a else "-"
                cells.append(f"{before + ' > ' + after:>14}")
            lines.append(f"{p.name:<34}{c_tok:>6}{(s['tokens_per_round'] if s else math.nan):>11.3f}  "
                         + "  ".join(cells))
    return "\n".join(lines)


def _x(v: float, w: int = 10) -> str:
    return f"{v:>{w - 1}.2f}x" if math.isfinite(v) else f"{'-':>{w}}"


def _f(v: float, w: int) -> str:
    return f"{v:>{w}.2f}" if math.isfinite(v) else f"{'-':>{w}}"


def write_plot(point: Point, c_base: float, c_tok: float, outdir: Path) -> str:
    """One PNG per replay point and cost model: running requests over cost-model time (none, suffix, before, after)
    and the four ratios per drafter."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = point.results[c_tok]
    rat = ratios(res, c_base, c_tok)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.2))
    for r in res:
        if r.name in ("none", "suffix", BEFORE, AFTER):
            t, b = zip(*r.batch_trace)
            # batch_trace was taken under the replay's own cost model; rescale to this one by steps and tokens.
            scale = r.time_at(c_base, c_tok) / max(r.sim_time_ms, 1e-9)
            ax0.step(np.asarray(t) * scale / 1000.0, b, where="post", label=r.name)
    ax0.set_xlabel("cost-model time (s)")
    ax0.set_ylabel("running requests")
    ax0.set_title(f"{point.name}: batch drain")
    ax0.legend(fontsize=8)
    keys = [("tpr_vs_suffix", "tok/round\nvs suffix"), ("tail_vs_none", "tail\nvs none"),
            ("time_vs_best", "time vs best of\nnone, suffix"), ("us_vs_suffix", "drafter us\nvs suffix")]
    width = 0.8 / max(1, len(res))
    for j, r in enumerate(res):
        vals = [rat[r.name][k] for k, _ in keys]
        vals = [min(v, 4.0) if math.isfinite(v) else 0.0 for v in vals]
        ax1.bar(np.arange(len(keys)) + j * width, vals, width, label=r.name)
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, [label for _, label in keys], fontsize=8)
    ax1.set_title(f"ratios (cost model {c_base} ms + {c_tok} ms/token; clipped at 4)")
    ax1.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{point.name.replace('@', '_at')}_ctok{c_tok}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def write_suite_json(path: str | Path, settings: dict, points: Sequence[Point], c_base: float,
                     c_toks: Sequence[float]) -> None:
    """Write a suite's ``settings`` and, per replay point and cost model, the ratios and every result as JSON."""
    payload = dict(settings, points=[{"name": p.name, "path": p.path, "eval_epoch": p.eval_epoch,
                                      "history_epochs": p.history_epochs, "requests": p.requests,
                                      "problems": p.problems, "tokens": p.tokens,
                                      "by_c_tok": {str(c): {"ratios": ratios(p.results[c], c_base, c),
                                                            "results": [r.summary() for r in p.results[c]]}
                                                   for c in c_toks}} for p in points])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=float))
