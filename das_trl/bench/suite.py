"""Replay suite: every recorded rollout set against none / ngram / suffix / the DAS variants, in one table.

``das-trl bench suite --sets DIR_OR_FILE ...`` finds every ``*.jsonl`` and ``*.jsonl.gz`` under the given folders
(the product's own recordings in ``benchmarks/sets/``, the third-party sets in ``../shared/realdata/``), replays
each one's last appearance given the earlier ones (``das_trl.bench.replay``: no model runs, hardware-independent),
and, for files with more than ``--early-appearance + 1`` appearances, also appearance ``--early-appearance`` (a
run's early history against its converged end). Each replay point is run once per drafter; drafters whose drafts
do not depend on the cost model are run once and re-costed for every ``--c-tok`` (``ReplayResult.time_at``), the
cost-aware ones (``das+controller``, ``das+cost``) are re-run per cost model.

Per set, drafter and cost model the table (:func:`das_trl.bench.report.format_table`) gives tokens per round (and vs
``suffix``), the tail in engine steps (and vs ``none``), the cost-model time without the CPU (``c_base * steps +
c_tok * verified tokens``; vs ``none`` and vs the better of ``none`` and ``suffix``), the proposer's CPU per engine
step and per request-round (the calls the live proposer makes, timed in the replay: :mod:`das_trl.bench.simulation`),
and the time with that CPU (``/ --host-speed``, plus ``--async-off-ms`` per step for speculative methods; vs ``none``
and vs the better of ``none`` and ``suffix``, each with its own CPU); then the two bounds, ``oracle-trim``
(``das+siblings``' drafts cut to exactly their accepted tokens; ``das+siblings`` is replayed for it when it is not
among the drafters) and ``oracle-text`` (the true continuation at the drafter's cap K), without CPU, and
``oracle-trim@16``: the same cut of the K-16 drafts the default used before long drafts (:data:`SHORT_DRAFTS`). The summary gives, per set
and cost model, the trainer default's time with the CPU vs ``none`` and vs the better of ``none`` and ``suffix``,
its gap to ``oracle-trim`` and its tokens per round.

Verification logprobs (``--c-logprob`` ms per row; default what an H200 measured, 1 us) are priced under the first of
``--shapes`` (``patched``: das-trl's logprob patch, one row per verified position) in the tables; each further shape
(``padded``: vLLM's own ``rows x (longest draft + 1)``) adds ``none``, ``suffix`` and the default priced under it (the
default re-run, since it plans for the shape), so a reader sees what a user of an unpatched vLLM gets.
``--admission`` adds ``none`` and the default replayed with their prompts' prefill under the engine's token budget
(:class:`~das_trl.bench.simulation.Admission`): what a burst of prompts costs with and without drafts.

Cost-model times are model figures, not measured wall times; the CPU times are measured on this machine. Outputs:
the tables on stdout, ``--json`` (the summary, every ratio and result), and ``--plots DIR`` (one PNG per replay
point and cost model: running requests over cost-model time, and the ratios per drafter and bound).

CLI::

    das-trl bench suite --sets benchmarks/sets ../shared/realdata [--c-tok 0.005 0.025 0.1] [--c-base 7]
        [--drafters none,ngram,suffix,das+siblings,das+policy,das+controller] [--json OUT] [--plots DIR]
        [--cache DIR] [--host-speed 1] [--draft-threads N] [--async-off-ms 0] [--c-logprob MS]
        [--shapes patched,padded] [--admission trainer|TOKENS] [--verify-limit profile|TOKENS]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from das_trl.bench.drafters import ALL_DRAFTERS, COST_AWARE, controller_config, draft_cap, make_drafter
from das_trl.bench.options import (add_cpu_args, add_engine_args, admission_for, drafter_names, int_or_never,
                                  json_overrides, limits_for, output_dir, output_file, positive_float)
from das_trl.bench.point import Point
from das_trl.bench.reliability import format_reliability, write_reliability_plot
from das_trl.bench.report import (DEFAULT, format_point, format_summary, format_table, provenance, write_plot,
                                  write_suite_json)
from das_trl.bench.sets import find_sets, load_epochs, set_name, split_epochs
from das_trl.bench.simulation import Admission, Bounds, ReplayResult, simulate
from das_trl.budget import ControllerConfig
from das_trl.budget.tiers import LengthPolicyConfig
from das_trl.drafter import DrafterConfig

DEFAULT_DRAFTERS = ("none", "ngram", "suffix", "das+siblings", "das+policy", "das+controller")
#: The replay ``oracle-trim`` cuts: the default drafter's drafts made to the hard cap every step.
BOUND_DRAFTER = "das+siblings"
#: The drafter settings before long drafts (K 16, drafts at most as long as their match, cut below a 5 % estimate,
#: 32-token trees): ``oracle-trim@16`` replays ``das+siblings`` with them, beside the bound of today's long drafts.
SHORT_DRAFTS = {"max_spec_tokens": 16, "max_spec_factor": 1.0, "min_token_prob": 0.05, "max_tree_depth": 32}


#: Bumped when a cached result's fields or meaning change (v2: per-step proposer CPU, background ingest; v3: per-step
#: rows, drafts and longest draft, the logprob price, admission).
CACHE_VERSION = 3


def _cache_file(cache: Path, path: Path, eval_epoch: int, drafter: str, das_overrides: dict, warmup: bool,
                draft_threads: int | None = None, admission: Admission | None = None) -> Path:
    """Where a cost-independent drafter's result for this file (by path, size and modification time), appearance and
    settings is kept."""
    st = path.stat()
    key = json.dumps([CACHE_VERSION, str(path.resolve()), st.st_size, st.st_mtime_ns, eval_epoch, drafter,
                      das_overrides, warmup, draft_threads, None if admission is None else asdict(admission)],
                     sort_keys=True)
    return cache / f"{set_name(path)}-{eval_epoch}-{drafter}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"


def run_point(path: Path, epochs: dict, eval_epoch: int, drafters: Sequence[str], c_base: float,
              c_toks: Sequence[float], das_overrides: dict, controller_overrides: dict, warmup: bool = True,
              cache: Path | None = None, draft_threads: int | None = None, c_logprob: float = 0.0,
              shapes: Sequence[str] = ("patched",), admission: Callable[[int], Admission | None] | None = None,
              limits: Callable[[int, str], object] | None = None) -> Point:
    """Replay one appearance of one file with every drafter under every cost model, and its bounds (``oracle-trim``
    needs ``das+siblings``: replayed for it when not among ``drafters``). With ``cache``, results of
    cost-independent drafters are read from / written to that folder (they depend only on the data, the drafter
    and its settings; the CPU times they carry are from the run that wrote them).

    Verification logprobs cost ``c_logprob`` per row under ``shapes[0]`` in the main results; every further shape
    adds a variant (:attr:`Point.variants`) with ``none`` and ``suffix`` re-priced and :data:`DEFAULT` re-run
    under it. ``admission`` (the batch's request count -> an :class:`Admission`, or ``None``): a variant
    ``"admission"`` with ``none`` and the default replayed with their prompts' prefill under ``shapes[0]``.
    ``limits`` (the batch's request count and a shape -> the engine's profiled verification limits, or ``None``):
    the default drafter keeps every step within them, under each shape."""
    train, evals, tr, ev = split_epochs(epochs, None, eval_epoch)
    point = Point(set_name(path) + ("" if eval_epoch == max(epochs) else f"@{eval_epoch}"), str(path), ev, tr,
                  len(evals), len({r.problem_key for r in evals}), sum(len(r.completion_ids) for r in evals))
    fixed: dict[str, ReplayResult] = {}
    main_shape = shapes[0]
    adm = None if admission is None else admission(len(evals))

    def replay(name: str, c_tok: float, overrides: dict | None = None, shape: str = main_shape,
               entry: Admission | None = None) -> ReplayResult:
        ov = das_overrides if overrides is None else overrides
        key = (name if overrides is None else f"{name}{json.dumps(overrides, sort_keys=True)}") + \
            ("" if entry is None else "+admission")
        cached = None if cache is None or name in COST_AWARE else _cache_file(cache, path, ev, name, ov, warmup,
                                                                             draft_threads, entry)
        if name not in COST_AWARE and key not in fixed and cached is not None and cached.exists():
            fixed[key] = ReplayResult(**json.loads(cached.read_text()))
        if key in fixed:  # the drafts do not depend on the price: re-priced
            return fixed[key].priced(c_logprob, shape)
        pc = LengthPolicyConfig(c_base_ms=c_base, c_tok_ms=c_tok)
        cc = controller_config(c_base, c_tok, controller_overrides, c_logprob, shape)
        res = simulate(make_drafter(name, policy_config=pc, das_overrides=ov, controller_config=cc,
                                    draft_threads=draft_threads),
                       train, evals, c_base, c_tok, warmup=warmup, c_logprob=c_logprob, verification_shape=shape,
                       admission=entry, limits=None if limits is None else limits(len(evals), shape))
        if name not in COST_AWARE:
            fixed[key] = res
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps(asdict(res)))
        return res

    for c_tok in c_toks:
        point.results[c_tok] = [replay(name, c_tok) for name in drafters]
        for shape in shapes[1:]:
            point.variants.setdefault(shape, {})[c_tok] = [
                replay(name, c_tok, shape=shape) for name in drafters if name in ("none", "suffix", DEFAULT)]
        if adm is not None:
            point.variants.setdefault("admission", {})[c_tok] = [
                replay(name, c_tok, entry=adm) for name in drafters if name in ("none", DEFAULT)]
    # The bounds: oracle-trim of the drafter's own drafts at its cap, oracle-text at that cap, and oracle-trim of the
    # short drafts (SHORT_DRAFTS over the same overrides) unless the drafts are that short already.
    k = draft_cap(das_overrides)
    short_ov = {**das_overrides, **SHORT_DRAFTS}
    short = None if short_ov == das_overrides or k <= SHORT_DRAFTS["max_spec_tokens"] else \
        replay(BOUND_DRAFTER, c_toks[0], short_ov)
    point.bounds = Bounds.of(replay(BOUND_DRAFTER, c_toks[0]), [len(r.completion_ids) for r in evals], k,
                             short, SHORT_DRAFTS["max_spec_tokens"] if short is not None else None)
    return point


def reliability_rows(points: Sequence[Point], c_toks: Sequence[float], drafter: str = DEFAULT) -> list[tuple[str, dict]]:
    """``(\"<point> <c_tok>\", reliability summary)`` of ``drafter``'s replay at every point and cost model (drafters
    without a budget controller have none)."""
    rows = []
    for p in points:
        for c in c_toks:
            for r in p.results.get(c, []):
                if r.name == drafter and r.reliability:
                    rows.append((f"{p.name} {c:g}", r.reliability))
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das-trl bench suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", required=True, help="folders (searched for *.jsonl, *.jsonl.gz) or files")
    p.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS),
                   help=f"comma-separated from {','.join(ALL_DRAFTERS)}, each once (default: %(default)s; "
                        "das+controller is das-trl's default drafter)")
    p.add_argument("--c-base", type=positive_float, default=7.0,
                   help="cost model: ms per forward pass (default: %(default)s)")
    c_toks = [0.025]  # a list (nargs): its help shows the values as typed, not the list's repr
    p.add_argument("--c-tok", type=positive_float, nargs="+", default=c_toks,
                   help=f"cost model: ms per token (several: a sweep; default: {' '.join(map(str, c_toks))})")
    p.add_argument("--early-appearance", type=int_or_never, default=7,
                   help="also replay this appearance of files with more appearances than this + 1 (-1: never; "
                        "default: %(default)s)")
    p.add_argument("--das-config", default=None, help="JSON of DrafterConfig overrides for every DAS variant")
    p.add_argument("--controller", default=None, help="JSON of ControllerConfig overrides for das+controller")
    p.add_argument("--no-warmup", action="store_true", help="see das-trl bench replay --no-warmup")
    add_cpu_args(p)
    add_engine_args(p, shapes=True)
    p.add_argument("--cache", type=output_dir, default=None,
                   help="folder for results of the cost-independent drafters (reused when the same file, appearance "
                        "and settings are replayed again)")
    p.add_argument("--json", type=output_file, default=None, help="write every result to this JSON file")
    p.add_argument("--plots", type=output_dir, default=None,
                   help="write one PNG per replay point and cost model into this folder")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    drafters = drafter_names(args.drafters, ALL_DRAFTERS)  # before any replay runs, not minutes into one
    das_ov = json_overrides(args.das_config, "--das-config", DrafterConfig)
    ctl_ov = json_overrides(args.controller, "--controller", ControllerConfig)
    code = provenance() if args.json else None  # the code that runs, not what is checked out at the end
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
                              not args.no_warmup, Path(args.cache) if args.cache else None, args.draft_threads,
                              args.c_logprob, args.shapes,
                              None if args.admission is None else (lambda n: admission_for(args, n)),
                              None if args.verify_limit is None else (lambda n, shape: limits_for(args, n, shape)))
            points.append(point)
            for c_tok in args.c_tok:
                print(format_point(point, args.c_base, c_tok, args.host_speed, args.async_off_ms))
                print()
                for name, by_c in point.variants.items():
                    print(f"{point.name} under {name}:")
                    print(format_table(by_c[c_tok], args.c_base, c_tok, args.host_speed, args.async_off_ms))
                    print()
            print(f"({point.name}: {time.perf_counter() - t0:.0f} s)\n", flush=True)
    print(format_summary(points, args.c_base, args.c_tok, args.host_speed, args.async_off_ms))
    rel = reliability_rows(points, args.c_tok)
    if rel:
        print()
        print(format_reliability(rel))
    if args.json:
        write_suite_json(args.json, {"c_base_ms": args.c_base, "c_tok_ms": args.c_tok, "drafters": drafters,
                                     "das_config_overrides": das_ov, "controller_overrides": ctl_ov,
                                     "draft_threads": args.draft_threads or 1, "c_logprob_ms": args.c_logprob,
                                     "verification_shapes": args.shapes,
                                     "admission": None if args.admission is None else
                                     {"token_budget": args.admission, "max_num_seqs": args.max_num_seqs,
                                      "prefix_cache": not args.no_prefix_cache},
                                     "verify_limit": args.verify_limit},
                         points, args.c_base, args.c_tok, args.host_speed, args.async_off_ms, code)
        print(f"wrote {args.json}")
    if args.plots:
        if rel:
            mid = args.c_tok[len(args.c_tok) // 2]
            print(f"wrote {write_reliability_plot([(label, r) for label, r in rel if label.endswith(f' {mid:g}')], Path(args.plots) / f'reliability_ctok{mid:g}.png')}")
        for p in points:
            for c_tok in args.c_tok:
                print(f"wrote {write_plot(p, args.c_base, c_tok, Path(args.plots), args.host_speed, args.async_off_ms)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
