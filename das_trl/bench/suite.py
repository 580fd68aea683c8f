"""Replay suite: every recorded rollout set against none / ngram / suffix / the DAS variants, in one table.

``das-trl bench suite --sets DIR_OR_FILE ...`` finds every ``*.jsonl`` and ``*.jsonl.gz`` under the given folders
(the product's own recordings in ``benchmarks/sets/``, the third-party sets in ``../shared/realdata/``), replays
each one's last appearance given the earlier ones (``das_trl.bench.replay``: no model runs, hardware-independent),
and, for files with more than ``--early-appearance + 1`` appearances, also appearance ``--early-appearance`` (a
run's early history against its converged end). Each replay point is run once per drafter; drafters whose drafts
do not depend on the cost model are run once and re-costed for every ``--c-tok`` (``ReplayResult.time_at``), the
cost-aware ones (``das+controller``, ``das+cost``) are re-run per cost model.

Per set, drafter and cost model the table gives:

- ``tok/round vs suffix``: tokens per verification round relative to vLLM's ``suffix`` method (drafting quality);
- ``tail vs none``: the most rounds any request needed (the batch's makespan in engine steps) relative to no
  speculation;
- ``time vs best``: cost-model time (``c_base * steps + c_tok * verified tokens``) relative to the better of ``none``
  and ``suffix`` (< 1: faster than both);
- ``us/req-round`` and ``vs suffix``: the drafter's own CPU time per request-round on this machine (it is added to
  every engine step), absolute and relative to ``suffix``.

Cost-model times are model figures, not measured wall times. Outputs: the table on stdout, ``--json`` (every
result), and ``--plots DIR`` (one PNG per replay point: running requests over cost-model time, and the four ratios
per drafter).

CLI::

    das-trl bench suite --sets benchmarks/sets ../shared/realdata [--c-tok 0.005 0.025 0.1] [--c-base 7]
        [--drafters none,ngram,suffix,das+siblings,das+policy,das+controller] [--json OUT] [--plots DIR]
        [--cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from das_trl.bench.replay import (ReplayResult, controller_config, load_epochs, make_drafter, simulate,
                                  split_epochs)
from das_trl.budget.tiers import LengthPolicyConfig

DEFAULT_DRAFTERS = ("none", "ngram", "suffix", "das+siblings", "das+policy", "das+controller")
#: Drafters whose drafts depend on the cost model (re-run for every --c-tok).
COST_AWARE = ("das+controller", "das+cost")
#: What the trainer ran by default before the controller (``tiers``) and what it runs now.
BEFORE, AFTER = "das+policy", "das+controller"


def find_sets(paths: Sequence[str | Path]) -> list[Path]:
    """Every ``*.jsonl`` / ``*.jsonl.gz`` file under the given folders (files are taken as they are), sorted.

    Raises:
        FileNotFoundError: a path does not exist, or no rollout file was found at all.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"--sets: {p} does not exist")
        if p.is_file():
            out.append(p)
        else:
            out += sorted(f for f in p.rglob("*") if f.is_file() and (f.name.endswith(".jsonl")
                                                                      or f.name.endswith(".jsonl.gz")))
    if not out:
        raise FileNotFoundError(f"--sets: no *.jsonl or *.jsonl.gz file under {', '.join(map(str, paths))}")
    return out


def set_name(path: Path) -> str:
    """Short name of a set: its file name without ``.jsonl`` / ``.jsonl.gz``."""
    name = path.name
    for ext in (".jsonl.gz", ".jsonl"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


@dataclass
class Point:
    """One replay point: a file replayed at one appearance, with its results per cost model."""

    name: str
    path: str
    eval_epoch: int
    history_epochs: list[int]
    requests: int
    problems: int
    tokens: int
    results: dict[float, list[ReplayResult]] = field(default_factory=dict)  # c_tok -> results in drafter order


def _cache_file(cache: Path, path: Path, eval_epoch: int, drafter: str, das_overrides: dict, warmup: bool) -> Path:
    """Where a cost-independent drafter's result for this file (by path, size and modification time), appearance and
    settings is kept."""
    st = path.stat()
    key = json.dumps([str(path.resolve()), st.st_size, st.st_mtime_ns, eval_epoch, drafter, das_overrides, warmup],
                     sort_keys=True)
    return cache / f"{set_name(path)}-{eval_epoch}-{drafter}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"


def run_point(path: Path, epochs: dict, eval_epoch: int, drafters: Sequence[str], c_base: float,
              c_toks: Sequence[float], das_overrides: dict, controller_overrides: dict, warmup: bool = True,
              cache: Path | None = None) -> Point:
    """Replay one appearance of one file with every drafter under every cost model. With ``cache``, results of
    cost-independent drafters are read from / written to that folder (they depend only on the data, the drafter
    and its settings; the drafter time they carry is from the run that wrote them)."""
    train, evals, tr, ev = split_epochs(epochs, None, eval_epoch)
    point = Point(set_name(path) + ("" if eval_epoch == max(epochs) else f"@{eval_epoch}"), str(path), ev, tr,
                  len(evals), len({r.problem_key for r in evals}), sum(len(r.completion_ids) for r in evals))
    fixed: dict[str, ReplayResult] = {}
    for c_tok in c_toks:
        row = []
        for name in drafters:
            cached = None if cache is None or name in COST_AWARE else _cache_file(cache, path, ev, name, das_overrides,
                                                                                 warmup)
            if name not in COST_AWARE and name not in fixed and cached is not None and cached.exists():
                fixed[name] = ReplayResult(**json.loads(cached.read_text()))
            if name in COST_AWARE or name not in fixed:
                pc = LengthPolicyConfig(c_base_ms=c_base, c_tok_ms=c_tok)
                res = simulate(make_drafter(name, policy_config=pc, das_overrides=das_overrides,
                                            controller_config=controller_config(c_base, c_tok, controller_overrides)),
                               train, evals, c_base, c_tok, warmup=warmup)
                if name not in COST_AWARE:
                    fixed[name] = res
                    if cached is not None:
                        cached.parent.mkdir(parents=True, exist_ok=True)
                        cached.write_text(json.dumps(asdict(res)))
            else:
                res = fixed[name]
            row.append(res)
        point.results[c_tok] = row
    return point


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
    import numpy as np

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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das-trl bench suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", required=True, help="folders (searched for *.jsonl, *.jsonl.gz) or files")
    p.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS),
                   help="comma-separated drafters (das_trl.bench.replay.ALL_DRAFTERS; default: %(default)s)")
    p.add_argument("--c-base", type=float, default=7.0, help="cost model: ms per forward pass")
    p.add_argument("--c-tok", type=float, nargs="+", default=[0.025], help="cost model: ms per token (several: "
                                                                            "a sweep)")
    p.add_argument("--early-appearance", type=int, default=7,
                   help="also replay this appearance of files with more appearances than this + 1 (-1: never)")
    p.add_argument("--das-config", default=None, help="JSON of DrafterConfig overrides for every DAS variant")
    p.add_argument("--controller", default=None, help="JSON of ControllerConfig overrides for das+controller")
    p.add_argument("--no-warmup", action="store_true", help="see das-trl bench replay --no-warmup")
    p.add_argument("--cache", default=None, help="folder for results of the cost-independent drafters (reused when "
                                                 "the same file, appearance and settings are replayed again)")
    p.add_argument("--json", default=None, help="write every result to this JSON file")
    p.add_argument("--plots", default=None, help="write one PNG per replay point and cost model into this folder")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    drafters = [x.strip() for x in args.drafters.split(",") if x.strip()]
    das_ov = json.loads(args.das_config) if args.das_config else {}
    ctl_ov = json.loads(args.controller) if args.controller else {}
    points: list[Point] = []
    for path in find_sets(args.sets):
        epochs = load_epochs(path)
        if len(epochs) < 2:
            print(f"{path}: skipped (needs at least 2 appearances, found {len(epochs)})")
            continue
        evals = [max(epochs)]
        if 0 < args.early_appearance + 1 < len(epochs) and args.early_appearance in epochs:
            evals.insert(0, args.early_appearance)
        for ev in evals:
            t0 = time.perf_counter()
            point = run_point(path, epochs, ev, drafters, args.c_base, args.c_tok, das_ov, ctl_ov,
                              not args.no_warmup, Path(args.cache) if args.cache else None)
            points.append(point)
            for c_tok in args.c_tok:
                print(format_point(point, args.c_base, c_tok))
                print()
            print(f"({point.name}: {time.perf_counter() - t0:.0f} s)\n", flush=True)
    print(format_summary(points, args.c_base, args.c_tok))
    if args.json:
        payload = {"c_base_ms": args.c_base, "c_tok_ms": args.c_tok, "drafters": drafters,
                   "das_config_overrides": das_ov, "controller_overrides": ctl_ov,
                   "points": [{"name": p.name, "path": p.path, "eval_epoch": p.eval_epoch,
                               "history_epochs": p.history_epochs, "requests": p.requests, "problems": p.problems,
                               "tokens": p.tokens,
                               "by_c_tok": {str(c): {"ratios": ratios(p.results[c], args.c_base, c),
                                                     "results": [r.summary() for r in p.results[c]]}
                                            for c in args.c_tok}} for p in points]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=2, default=float))
        print(f"wrote {args.json}")
    if args.plots:
        for p in points:
            for c_tok in args.c_tok:
                print(f"wrote {write_plot(p, args.c_base, c_tok, Path(args.plots))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
