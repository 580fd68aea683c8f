"""The replay's report: tables, JSON and plots, for one replay (``das-trl bench replay``) and for a suite of them
(``das-trl bench suite``). A new metric is a field of :class:`~das_trl.bench.simulation.ReplayResult` plus a column
here.

Table (:func:`format_table`; one per replay, one per suite point and cost model): per drafter and for the two bounds
(``oracle-trim``, ``oracle-text``: :class:`~das_trl.bench.simulation.Bounds`), tokens per verification round
(emitted tokens / request-rounds) and vs ``suffix``, tail steps (the batch's step count) and vs ``none``, the
cost-model time without the CPU (vs ``none``, vs the better of ``none`` and ``suffix``), the proposer's CPU per
engine step (ms) and per request-round (us), and the time with the CPU (vs ``none``, vs the better of ``none`` and
``suffix``, each with its own CPU). The replay adds tokens per round by length tier.

Suite summary (:func:`format_summary`): per replay point and cost model, the trainer default's (:data:`DEFAULT`)
time with the CPU vs ``none`` and vs the better of ``none`` and ``suffix``, its gap to ``oracle-trim``, the bounds vs
that best, tokens per round and its CPU.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np

from das_trl.bench.point import Point
from das_trl.bench.simulation import ORACLE_K, Bounds, ReplayResult

#: The trainer default (the suite summary's drafter).
DEFAULT = "das+controller"


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


def table_legend(k: int = ORACLE_K) -> tuple[str, ...]:
    """What the table's columns mean, for ``das-trl bench replay`` (one table, read by newcomers; the suite prints one
    per point and cost model and leaves it out): lines of at most 120 columns, the bounds as :class:`Bounds` computes
    them (``k``: the draft cap of ``oracle-text``, :attr:`Bounds.k`)."""
    return (
        "tok/rd: emitted tokens per request-round (vs sfx: over suffix's); tail: engine steps until the last request "
        "ends",
        "vs none, vs best: over none's, over the better of none's and suffix's (lower is faster); with suffix not "
        "among",
        "  --drafters, vs sfx shows - and vs best equals vs none",
        "+CPU ms: time ms plus the CPU and async-off charge; CPU ms/st, us/req-rd: the proposer's critical-path CPU "
        "per",
        "  step, per request-round; bg ms/st: its background work per step (overlaps the pass)",
        "oracle-trim, oracle-text: bounds, no CPU: das+siblings' drafts at the hard cap, each cut to its accepted "
        "tokens;",
        f"  the true continuation at the draft cap K = {k}",
    )


def format_table(results: Sequence[ReplayResult], c_base: float = 7.0, c_tok: float = 0.025,
                 host_speed: float = 1.0, async_off_ms: float = 0.0, bounds: Bounds | None = None,
                 legend: bool = False) -> str:
    """Per drafter (then the bounds): tokens per round (and vs ``suffix``), tail steps (and vs ``none``), the
    cost-model time without the CPU (ms, vs ``none``, vs the better of ``none`` and ``suffix``), the proposer's CPU
    per engine step (ms: the critical path, background work beyond a step's forward pass included) and per
    request-round (us), its background work per step beside it (ms, the ingest thread's, overlapping the forward
    pass), and the time with the CPU (ms, vs ``none`` and vs the better of ``none`` and ``suffix``, each with its own
    CPU). ``*``: CPU measured but not representative (``ngram``). A line under the table names the product's
    default (:data:`DEFAULT`) when it is among the rows; ``legend``: :func:`table_legend` under it as well."""
    rat = ratios(results, c_base, c_tok, host_speed, async_off_ms, bounds)
    head = (f"{'drafter':<16}{'tok/rd':>7}{'vs sfx':>7}{'tail':>6}{'vs none':>8}{'time ms':>10}{'vs none':>8}"
            f"{'vs best':>8}{'CPU ms/st':>10}{'us/req-rd':>10}{'bg ms/st':>9}{'+CPU ms':>10}{'vs none':>8}"
            f"{'vs best':>8}")
    lines = [f"{'':<44}|{'without CPU':^26}|{'proposer CPU':^29}|{'with CPU':^26}", head, "-" * len(head)]
    flagged = False
    for name, x in rat.items():
        bound = x.get("bound", False)
        star = "" if x.get("cpu_representative", True) else "*"
        flagged |= bool(star)
        cpu = (f"{'-':>10}{'-':>10}{'-':>9}" if bound else
               f"{x['cpu_ms_per_step']:>10.3f}{x['cpu_us_per_round']:>10.2f}{x['bg_ms_per_step']:>9.3f}")
        lines.append(f"{(name + star):<16}{x['tokens_per_round']:>7.3f}{_x(x['tpr_vs_suffix'], 7)}{x['tail']:>6d}"
                     f"{_f(x['tail_vs_none'], 8)}{x['time_ms']:>10.0f}{_f(x['time_vs_none'], 8, 3)}"
                     f"{_f(x['time_vs_best'], 8, 3)}{cpu}{x['time_cpu_ms']:>10.0f}{_f(x['time_cpu_vs_none'], 8, 3)}"
                     f"{_f(x['time_cpu_vs_best'], 8, 3)}")
    # the logprob rows' price as the replay's first line words it (each result carries its own: a suite variant's
    # table is priced under another shape)
    logprob = "".join(f" + {lp} ms per logprob row ({shape})"
                      for lp, shape in dict.fromkeys((r.logprob_ms, r.verification_shape) for r in results))
    lines.append(f"cost model {c_base} ms + {c_tok} ms/token{logprob}; CPU: this machine's thread CPU time / host "
                 f"speed {host_speed:g}, async-off charge {async_off_ms:g} ms/step (speculative methods); "
                 "bounds: no CPU")
    if DEFAULT in rat:  # a line of its own: the rows keep their columns for whoever splits them
        lines.append(f"{DEFAULT}: das-trl's default drafter")
    if flagged:
        lines.append("* CPU measured but not representative (vLLM's ngram is a numba kernel)")
    if legend:
        lines.extend(table_legend(bounds.k if bounds is not None else ORACLE_K))
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


def write_replay_json(path: str | Path, settings: dict, results: Sequence[ReplayResult], c_base: float = 7.0,
                      c_tok: float = 0.025, host_speed: float = 1.0, async_off_ms: float = 0.0,
                      bounds: Bounds | None = None) -> None:
    """Write one replay's ``settings``, every result (summary with the times without and with the CPU, length
    tiers), the ratios table (bounds included) and the bounds' counts as JSON."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    payload = dict(settings, host_speed=host_speed, async_off_ms=async_off_ms,
                   results=[dict(r.summary(c_base, c_tok, host_speed, async_off_ms), tiers=tier_tokens_per_round(r))
                            for r in results],
                   ratios=ratios(results, c_base, c_tok, host_speed, async_off_ms, bounds),
                   bounds=asdict(bounds) if bounds is not None else None)
    Path(path).write_text(json.dumps(payload, indent=2, default=float))


# ---------------------------------------------------------------------------- a suite of replays
def ratios(results: Sequence[ReplayResult], c_base: float, c_tok: float, host_speed: float = 1.0,
           async_off_ms: float = 0.0, bounds: Bounds | None = None) -> dict[str, dict[str, float]]:
    """Per drafter (and, with ``bounds``, ``oracle-trim`` / ``oracle-text``): ``tokens_per_round``,
    ``tpr_vs_suffix``, ``tail`` (steps), ``tail_vs_none``; without the CPU ``time_ms``, ``time_vs_none``,
    ``time_vs_best`` (the better of none and suffix); the proposer's CPU ``cpu_ms`` (critical path, scaled by
    ``host_speed``; its background work beyond a step's forward pass included), ``cpu_ms_per_step``,
    ``cpu_us_per_round``, ``us_per_round`` (measured, unscaled) and ``us_vs_suffix``; the background work beside it
    (the ingest thread's, overlapping the forward passes): ``bg_ms_per_step`` (all of it, scaled) and
    ``bg_excess_ms`` (the part that outlasted its step's forward pass, already in ``cpu_ms``); with the CPU (and ``async_off_ms`` per step for speculative methods) ``time_cpu_ms``,
    ``time_cpu_vs_none``, ``time_cpu_vs_best`` (each reference with its own CPU). nan where a reference is
    missing. Bounds carry ``bound: True`` and no CPU."""
    by = {r.name: r for r in results}
    none, suffix = by.get("none"), by.get("suffix")
    refs = [r for r in (none, suffix) if r is not None]
    best = min((r.time_at(c_base, c_tok) for r in refs), default=math.nan)
    best_cpu = min((r.time_with_cpu(c_base, c_tok, host_speed, async_off_ms) for r in refs), default=math.nan)
    none_t = none.time_at(c_base, c_tok) if none else math.nan
    none_cpu = none.time_with_cpu(c_base, c_tok, host_speed, async_off_ms) if none else math.nan
    sfx_us = 1e6 * suffix.drafter_seconds / max(1, suffix.rounds) if suffix else math.nan
    sfx_tpr = suffix.tokens_per_round if suffix else math.nan
    out: dict[str, dict] = {}
    for r in results:
        us = 1e6 * r.drafter_seconds / max(1, r.rounds)
        t = r.time_at(c_base, c_tok)
        cpu = r.cpu_ms(c_base, c_tok, host_speed)
        bg = r.background_ms(host_speed)
        tc = r.time_with_cpu(c_base, c_tok, host_speed, async_off_ms)
        out[r.name] = {"tokens_per_round": r.tokens_per_round, "tpr_vs_suffix": r.tokens_per_round / sfx_tpr,
                       "tail": r.steps, "tail_vs_none": r.steps / none.steps if none else math.nan,
                       "time_ms": t, "time_vs_none": t / none_t, "time_vs_best": t / best,
                       "cpu_ms": cpu, "cpu_ms_per_step": cpu / max(1, r.steps),
                       "bg_ms_per_step": bg / max(1, r.steps),
                       "bg_excess_ms": r.background_excess_ms(c_base, c_tok, host_speed),
                       "cpu_us_per_round": 1000.0 * cpu / max(1, r.rounds), "us_per_round": us,
                       "us_vs_suffix": us / sfx_us if sfx_us > 0 else math.nan,
                       "time_cpu_ms": tc, "time_cpu_vs_none": tc / none_cpu, "time_cpu_vs_best": tc / best_cpu,
                       "cpu_representative": r.cpu_representative, "bound": False}
    if bounds is not None:
        rows = [("oracle-trim", bounds.trim_time(c_base, c_tok), bounds.trim_tokens_per_round, bounds.trim_steps),
                ("oracle-text", bounds.text_time(c_base, c_tok), bounds.text_tokens_per_round, bounds.text_steps)]
        short = bounds.short_trim_time(c_base, c_tok)
        if short is not None:
            rows.append((f"oracle-trim@{bounds.short_k}", short, bounds.tokens / max(1, bounds.short_trim_rounds),
                         bounds.short_trim_steps))
        for name, t, tpr, steps in rows:
            out[name] = {"tokens_per_round": tpr, "tpr_vs_suffix": tpr / sfx_tpr, "tail": steps,
                         "tail_vs_none": steps / none.steps if none else math.nan, "time_ms": t,
                         "time_vs_none": t / none_t, "time_vs_best": t / best, "cpu_ms": 0.0,
                         "cpu_ms_per_step": 0.0, "bg_ms_per_step": 0.0, "bg_excess_ms": 0.0,
                         "cpu_us_per_round": 0.0, "us_per_round": 0.0,
                         "us_vs_suffix": math.nan, "time_cpu_ms": t, "time_cpu_vs_none": t / none_cpu,
                         "time_cpu_vs_best": t / best_cpu, "cpu_representative": True, "bound": True}
    return out


def format_point(point: Point, c_base: float, c_tok: float, host_speed: float = 1.0,
                 async_off_ms: float = 0.0) -> str:
    """The table block of one replay point under one cost model (:func:`format_table` with the point's bounds)."""
    return (f"{point.name}: {point.requests} requests, {point.problems} problems, {point.tokens} tokens, replaying "
            f"appearance {point.eval_epoch} after {len(point.history_epochs)}\n"
            + format_table(point.results[c_tok], c_base, c_tok, host_speed, async_off_ms, point.bounds))


def summary_rows(points: Sequence[Point], c_base: float, c_toks: Sequence[float], host_speed: float = 1.0,
                 async_off_ms: float = 0.0, default: str = DEFAULT) -> list[dict]:
    """One row per replay point and cost model for the trainer default: ``time_cpu_vs_none``, ``time_cpu_vs_best``
    (the better of none and suffix, each with its own CPU), ``time_vs_best`` (all without the CPU),
    ``gap_to_trim`` (default with CPU / oracle-trim - 1), ``trim_vs_best`` / ``text_vs_best`` (the bounds / best
    with CPU), ``short_trim_vs_best`` (``oracle-trim`` of the shorter K-16 drafts, when replayed), ``tokens_per_round``,
    ``cpu_ms_per_step`` (critical path), ``bg_ms_per_step`` (background, beside it), ``cpu_us_per_round``."""
    rows = []
    for c_tok in c_toks:
        for p in points:
            rat = ratios(p.results[c_tok], c_base, c_tok, host_speed, async_off_ms, p.bounds)
            a = rat.get(default)
            nan = math.nan
            trim, text = rat.get("oracle-trim"), rat.get("oracle-text")
            short = next((v for k, v in rat.items() if k.startswith("oracle-trim@")), None)
            rows.append({"set": p.name, "c_tok": c_tok, "requests": p.requests,
                         "tokens_per_round": a["tokens_per_round"] if a else nan,
                         "time_cpu_vs_none": a["time_cpu_vs_none"] if a else nan,
                         "time_cpu_vs_best": a["time_cpu_vs_best"] if a else nan,
                         "time_vs_best": a["time_vs_best"] if a else nan,
                         "gap_to_trim": a["time_cpu_ms"] / trim["time_ms"] - 1.0 if a and trim else nan,
                         "trim_vs_best": trim["time_cpu_vs_best"] if trim else nan,
                         "text_vs_best": text["time_cpu_vs_best"] if text else nan,
                         "short_trim_vs_best": short["time_cpu_vs_best"] if short else nan,
                         "cpu_ms_per_step": a["cpu_ms_per_step"] if a else nan,
                         "bg_ms_per_step": a["bg_ms_per_step"] if a else nan,
                         "cpu_us_per_round": a["cpu_us_per_round"] if a else nan})
    return rows


def format_summary(points: Sequence[Point], c_base: float, c_toks: Sequence[float], host_speed: float = 1.0,
                   async_off_ms: float = 0.0, default: str = DEFAULT) -> str:
    """One line per replay point and cost model for the trainer default (:func:`summary_rows`)."""
    head = (f"{'set':<34}{'c_tok':>6}{'req':>5}{'tok/rd':>8}{'+CPU/none':>10}{'+CPU/best':>10}{'noCPU/best':>11}"
            f"{'gap trim':>9}{'trim/best':>10}{'trim16/bst':>11}{'text/best':>10}{'CPU ms/st':>10}{'us/req-rd':>10}"
            f"{'bg ms/st':>9}")
    lines = [f"default = {default}; time with the proposer's CPU (host speed {host_speed:g}, async-off "
             f"{async_off_ms:g} ms/step) vs none and vs the better of none and suffix (each with its own CPU); "
             f"gap trim = default with CPU / oracle-trim - 1; trim16 = oracle-trim of the K-16 drafts; CPU = the "
             f"critical path (background beyond a step's forward pass included), bg = background work per step", head,
             "-" * len(head)]
    for r in summary_rows(points, c_base, c_toks, host_speed, async_off_ms, default):
        lines.append(f"{r['set']:<34}{r['c_tok']:>6}{r['requests']:>5}{_f(r['tokens_per_round'], 8, 3)}"
                     f"{_f(r['time_cpu_vs_none'], 10, 3)}{_f(r['time_cpu_vs_best'], 10, 3)}"
                     f"{_f(r['time_vs_best'], 11, 3)}{_pct(r['gap_to_trim'], 9)}{_f(r['trim_vs_best'], 10, 3)}"
                     f"{_f(r['short_trim_vs_best'], 11, 3)}{_f(r['text_vs_best'], 10, 3)}{_f(r['cpu_ms_per_step'], 10, 3)}"
                     f"{_f(r['cpu_us_per_round'], 10, 2)}{_f(r['bg_ms_per_step'], 9, 3)}")
    return "\n".join(lines)


def _pct(v: float, w: int) -> str:
    return f"{100 * v:>{w - 1}.1f}%" if math.isfinite(v) else f"{'-':>{w}}"


def _x(v: float, w: int = 10) -> str:
    return f"{v:>{w - 1}.2f}x" if math.isfinite(v) else f"{'-':>{w}}"


def _f(v: float, w: int, digits: int = 2) -> str:
    return f"{v:>{w}.{digits}f}" if math.isfinite(v) else f"{'-':>{w}}"


def write_plot(point: Point, c_base: float, c_tok: float, outdir: Path, host_speed: float = 1.0,
               async_off_ms: float = 0.0) -> str:
    """One PNG per replay point and cost model: running requests over cost-model time (none, suffix, das+policy,
    the default) and, per drafter and bound, tokens per round vs suffix, tail vs none, and the time without / with
    the CPU vs the better of none and suffix."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = point.results[c_tok]
    rat = ratios(res, c_base, c_tok, host_speed, async_off_ms, point.bounds)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.2))
    for r in res:
        if r.name in ("none", "suffix", "das+policy", DEFAULT):
            t, b = zip(*r.batch_trace)
            # batch_trace was taken under the replay's own cost model; rescale to this one by steps and tokens.
            scale = r.time_at(c_base, c_tok) / max(r.sim_time_ms, 1e-9)
            ax0.step(np.asarray(t) * scale / 1000.0, b, where="post", label=r.name)
    ax0.set_xlabel("cost-model time (s)")
    ax0.set_ylabel("running requests")
    ax0.set_title(f"{point.name}: batch drain")
    ax0.legend(fontsize=8)
    keys = [("tpr_vs_suffix", "tok/round\nvs suffix"), ("tail_vs_none", "tail\nvs none"),
            ("time_vs_best", "time vs best,\nno CPU"), ("time_cpu_vs_best", "time vs best,\nwith CPU")]
    width = 0.8 / max(1, len(rat))
    for j, (name, x) in enumerate(rat.items()):
        vals = [x[k] for k, _ in keys]
        vals = [min(v, 4.0) if math.isfinite(v) else 0.0 for v in vals]
        ax1.bar(np.arange(len(keys)) + j * width, vals, width, label=name)
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


#: Most points a running-requests trace keeps in the suite JSON (it is thinned to this many change points).
TRACE_POINTS = 120


def _thin(trace: list[list[float]], max_points: int = TRACE_POINTS) -> list[list[float]]:
    """Keep the first point, the points where the running count changes, and the last; then at most ``max_points``
    of them, evenly spaced over the change points (the count only falls, so the shape survives)."""
    keep = [trace[0]] + [b for a, b in zip(trace, trace[1:]) if b[1] != a[1]]
    if keep[-1] is not trace[-1]:
        keep.append(trace[-1])
    if len(keep) > max_points:
        idx = np.unique(np.linspace(0, len(keep) - 1, max_points).round().astype(int))
        keep = [keep[i] for i in idx]
    return keep


def running_trace(r: ReplayResult, c_base: float, c_tok: float, host_speed: float = 1.0,
                  async_off_ms: float = 0.0, max_points: int = TRACE_POINTS) -> list[list[float]]:
    """Running requests over the time with the CPU: ``[[t_ms, running], ...]`` at step starts, ending at
    ``[time_with_cpu, 0]`` (:meth:`ReplayResult.time_with_cpu`: each step costs ``c_base + c_tok * step tokens``
    plus its proposer CPU / ``host_speed``, its background ingest beyond the forward pass and, for a speculative
    method, ``async_off_ms``), thinned by :func:`_thin`. Empty without per-step data."""
    if not r.step_tokens or len(r.batch_trace) != len(r.step_tokens) + 1:
        return []
    hs = float(host_speed)
    fwd = c_base + c_tok * np.asarray(r.step_tokens, np.float64)
    dt = fwd.copy()
    if r.proposer_seconds and len(r.proposer_seconds) == len(fwd):
        dt += 1000.0 * np.asarray(r.proposer_seconds, np.float64) / hs
        if r.background_seconds and len(r.background_seconds) == len(fwd):
            dt += np.maximum(0.0, 1000.0 * np.asarray(r.background_seconds, np.float64) / hs - fwd)
    if r.speculative:
        dt += async_off_ms
    t = np.concatenate([[0.0], np.cumsum(dt)])
    return _thin([[round(float(x), 2), int(b)] for x, (_, b) in zip(t, r.batch_trace)], max_points)


def oracle_text_trace(lengths: Sequence[int], c_base: float, c_tok: float, k: int,
                      max_points: int = TRACE_POINTS) -> list[list[float]]:
    """Running requests over time for the ``oracle-text`` bound (each round of a request emits ``min(k + 1,
    remaining)`` tokens, all verified; a step costs ``c_base + c_tok * its tokens``; no CPU), as
    :func:`running_trace`: it ends at :meth:`Bounds.text_time`."""
    n = np.asarray([x for x in lengths if x > 0], np.int64)
    if n.size == 0:
        return [[0.0, 0]]
    rounds = -(-n // (k + 1))
    trace, t = [], 0.0
    for s in range(int(rounds.max())):
        run = rounds > s
        trace.append([round(t, 2), int(run.sum())])
        t += c_base + c_tok * float(np.minimum(k + 1, n[run] - s * (k + 1)).sum())
    trace.append([round(t, 2), 0])
    return _thin(trace, max_points)


def provenance() -> dict:
    """Where the CPU times were measured (``host``: CPU count, architecture, CPU model) and the code that ran
    (``das_trl_commit``: the checkout's commit, ``+changes`` when das_trl/ differs from it; absent outside git).
    Take it when a run starts: a commit made while the run goes on is not the code that ran."""
    import os
    import platform
    import subprocess

    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    out: dict = {"host": {k: v for k, v in (("cpus", os.cpu_count()), ("machine", platform.machine()),
                                            ("cpu", model)) if v}}
    pkg = Path(__file__).resolve().parents[1]
    try:
        run = dict(cwd=pkg, capture_output=True, text=True, timeout=10)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], **run)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(pkg)], **run).returncode != 0
            out["das_trl_commit"] = head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def write_suite_json(path: str | Path, settings: dict, points: Sequence[Point], c_base: float,
                     c_toks: Sequence[float], host_speed: float = 1.0, async_off_ms: float = 0.0,
                     code: dict | None = None) -> None:
    """Write a suite's ``settings``, its summary rows (:func:`summary_rows`) and, per replay point and cost model,
    the ratios (bounds included), every result's summary with its times with and without the CPU, the running
    requests over the time with the CPU per drafter and for ``oracle-text`` (``traces``: :func:`running_trace`),
    the ratios and summaries of its variants (``variants``: another verification shape, admission), the bounds'
    counts, and where and with which code it ran (``code``: :func:`provenance` taken when the run started; default:
    taken now), as JSON (gzipped when ``path`` ends in ``.gz``)."""
    def traces(p: Point, c: float) -> dict:
        out = {r.name: running_trace(r, c_base, c, host_speed, async_off_ms) for r in p.results[c]}
        if p.bounds is not None and p.results[c]:
            out["oracle-text"] = oracle_text_trace(p.results[c][0].lengths, c_base, c, p.bounds.k)
        return out

    def point(p: Point) -> dict:
        return {"name": p.name, "path": p.path, "eval_epoch": p.eval_epoch, "history_epochs": p.history_epochs,
                "requests": p.requests, "problems": p.problems, "tokens": p.tokens,
                "bounds": asdict(p.bounds) if p.bounds is not None else None,
                "by_c_tok": {str(c): {"ratios": ratios(p.results[c], c_base, c, host_speed, async_off_ms, p.bounds),
                                      "results": [r.summary(c_base, c, host_speed, async_off_ms)
                                                  for r in p.results[c]],
                                      "traces": traces(p, c)}
                             for c in c_toks},
                "variants": {name: {str(c): {"ratios": ratios(by_c[c], c_base, c, host_speed, async_off_ms),
                                             "results": [r.summary(c_base, c, host_speed, async_off_ms)
                                                         for r in by_c[c]]}
                                    for c in c_toks if c in by_c}
                             for name, by_c in p.variants.items()}}

    code = provenance() if code is None else code
    payload = dict(settings, host_speed=host_speed, async_off_ms=async_off_ms, **code,
                   summary=summary_rows(points, c_base, c_toks, host_speed, async_off_ms),
                   points=[point(p) for p in points])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2, default=float)
    if str(path).endswith(".gz"):  # gzip without a timestamp: the same results give the same bytes
        Path(path).write_bytes(gzip.compress(text.encode(), 9, mtime=0))
    else:
        Path(path).write_text(text)
