"""Benchmark: the drafter's memory stays bounded by its history token budget (reliability case 1).

Pushes a synthetic GRPO run through the drafter the engine runs (``--backend native``, the default:
:class:`~das_trl.drafter.NativeDASDrafter` at its default tree depth, ``--max-tree-depth`` to change it;
``--backend python``: the pure-Python reference over arctic-inference's trees) — ``--problems`` problems,
each appearing ``--appearances`` times (one appearance per RL epoch) with ``--samples`` sibling completions of about
``--length`` tokens — and checks after every push that

- the history holds at most ``--budget`` completion tokens (``stats()["tokens"]``);
- evictions are counted (``stats()["evicted_appearances"]`` equals appearances pushed minus appearances kept);
- eviction is oldest-first: a :class:`~das_trl.drafter.RolloutHistory` given the same pushes keeps exactly the most
  recent appearances (with ``appearances <= window`` only the budget evicts, so the kept ones are a suffix of the
  push order).

It reports the process's resident memory (psutil RSS) per history token, the native core's own count of its history
automata per history token (``bytes_per_history_token`` in ``stats()``: problem and global automata), the history's
token storage (``approx_bytes``), the time of each push, and the time to take a state dict and a history digest at the
final size (the cost of checkpointing and of the engine-consistency check).

Default run (a second on 2 CPU cores)::

    das-trl bench history-memory

Your own rollouts (a file ``das_record_rollouts`` wrote, or a recorded set): every recorded step is pushed in order,
as the trainer pushes it, at the trainer's default budget (8M tokens) unless ``--budget`` is given::

    das-trl bench history-memory --rollouts runs/embedded-default/rollouts.jsonl

Full size of the reliability catalogue (10,000 problems x 16 samples x 16 appearances, long completions; hours of
tree building on a 2-core CPU)::

    python -m das_trl.bench.micro.history_memory --problems 10000 --samples 16 --appearances 16 --window 16 \
        --length 2048 --budget 32000000

Siblings of a problem are its template with ~10% of tokens resampled and ragged lengths (60-100% of ``--length``),
so the automata see realistic repetition rather than pure noise. RSS includes the automata (or the reference's trees
and its fixed support table, allocated before the baseline), the history's token storage and allocator slack;
figures are per machine, not a speed claim.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

from das_trl.bench.options import non_negative_int, output_file, positive_int
from das_trl.drafter import DrafterConfig, RolloutHistory, create_drafter
from das_trl.drafter.digest import state_digest


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _siblings(rng: np.random.Generator, template: np.ndarray, samples: int, vocab: int) -> list[np.ndarray]:
    block = np.tile(template, (samples, 1))
    mask = rng.random(block.shape) < 0.10
    block[mask] = rng.integers(0, vocab, int(mask.sum()), dtype=np.int32)
    lengths = rng.integers(len(template) * 6 // 10, len(template) + 1, samples)
    return [block[i, : lengths[i]].copy() for i in range(samples)]


def run(problems: int = 64, samples: int = 16, appearances: int = 4, length: int = 128, window: int = 16,
        budget: int = 200_000, problems_per_step: int = 64, vocab: int = 49152, seed: int = 0,
        verbose: bool = False, backend: str = "native", max_tree_depth: int | None = None) -> dict:
    """Push the synthetic run and measure; see the module docstring.

    Args:
        problems, samples, appearances, length: size of the synthetic run (ints >= 1).
        window, budget: the drafter's ``window`` and ``history_token_budget``.
        problems_per_step: problems per GRPO step (one ``add_rollouts`` call).
        vocab: token ids are drawn from ``[0, vocab)``.
        seed: RNG seed.
        verbose: print one line per RL epoch.
        backend: ``DrafterConfig.backend`` (``"native"``, the engine's drafter; ``"python"``, the reference).
        max_tree_depth: ``DrafterConfig.max_tree_depth``; None keeps the default (64).

    Returns:
        ``dict`` with the sizes, ``pushed_tokens``, ``pushed_appearances``, ``max_history_tokens`` (largest
        ``stats()["tokens"]`` after any push), ``budget_held`` (bool), ``evicted_appearances``,
        ``evictions_counted`` (bool), ``oldest_first`` (bool), ``history_tokens``, ``history_approx_bytes``,
        ``rss_baseline_bytes``, ``rss_final_bytes``, ``rss_peak_bytes``, ``rss_bytes_per_history_token``,
        ``bytes_per_history_token`` (the native core's automata per history token; None for the reference),
        ``backend``, ``max_tree_depth``,
        ``push_seconds_mean``, ``push_seconds_max``, ``state_dict_seconds``, ``digest_seconds``, ``seconds``.

    Raises:
        ValueError: a size is < 1, or a ``DrafterConfig`` field is out of range.
        ImportError: ``backend="native"`` without the built core, or ``"python"`` without arctic-inference.
    """
    for name, value in dict(problems=problems, samples=samples, appearances=appearances, length=length,
                            problems_per_step=problems_per_step).items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    config = DrafterConfig(window=window, history_token_budget=budget, backend=backend,
                           **({} if max_tree_depth is None else {"max_tree_depth": max_tree_depth}))
    drafter = create_drafter(config)
    mirror = RolloutHistory(window, budget)
    gc.collect()
    rss_baseline = rss_peak = _rss()
    prompts = rng.integers(0, vocab, (problems, 64), dtype=np.int32)
    templates = rng.integers(0, vocab, (problems, length), dtype=np.int32)
    pushed_tokens = pushed_apps = max_tokens = 0
    push_seconds: list[float] = []
    order: list[tuple[int, int]] = []  # (problem, epoch) in push order
    evictions_ok = True
    for epoch in range(appearances):
        for first in range(0, problems, problems_per_step):
            ps, cs, keys = [], [], []
            for p in range(first, min(first + problems_per_step, problems)):
                comps = _siblings(rng, templates[p], samples, vocab)
                ps += [prompts[p]] * samples
                cs += comps
                keys += [p] * samples
                mirror.add(p, comps)
                order.append((p, epoch))
            t0 = time.perf_counter()
            added = drafter.add_rollouts(ps, cs, keys)
            push_seconds.append(time.perf_counter() - t0)
            pushed_tokens += added["tokens"]
            pushed_apps += added["problems"]
            stats = drafter.stats()
            max_tokens = max(max_tokens, stats["tokens"])
            evictions_ok &= stats["evicted_appearances"] == pushed_apps - stats["appearances"]
            rss_peak = max(rss_peak, _rss())
        if verbose:
            print(f"epoch {epoch + 1}/{appearances}: history {stats['tokens']:,} tokens, "
                  f"{stats['appearances']:,} appearances, evicted {stats['evicted_appearances']:,}, "
                  f"RSS +{(_rss() - rss_baseline) / 2**20:.0f} MiB", flush=True)
    stats = drafter.stats()
    rss_final = _rss()
    kept = [(a.problem_key, a.appearance_id) for a in mirror.appearances()]
    # appearance ids are push order; oldest-first eviction keeps the newest ones, contiguously when only the budget
    # evicts (appearances <= window).
    kept_ids = [app_id for _, app_id in kept]
    oldest_first = (kept_ids == list(range(len(order) - len(kept_ids), len(order)))
                    if appearances <= window else kept_ids == sorted(kept_ids))
    oldest_first &= mirror.stats()["tokens"] == stats["tokens"]
    t0 = time.perf_counter()
    state = drafter.state_dict()["history"]
    state_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    state_digest(state)
    digest_seconds = time.perf_counter() - t0
    return {
        "problems": problems, "samples": samples, "appearances": appearances, "length": length, "window": window,
        "budget": budget, "pushed_tokens": pushed_tokens, "pushed_appearances": pushed_apps,
        "max_history_tokens": max_tokens, "budget_held": max_tokens <= budget,
        "evicted_appearances": stats["evicted_appearances"], "evictions_counted": bool(evictions_ok),
        "oldest_first": bool(oldest_first), "history_tokens": stats["tokens"],
        "history_appearances": stats["appearances"], "history_approx_bytes": stats["approx_bytes"],
        "backend": backend, "max_tree_depth": config.max_tree_depth,
        "bytes_per_history_token": stats.get("bytes_per_history_token"),
        "rss_baseline_bytes": rss_baseline, "rss_final_bytes": rss_final, "rss_peak_bytes": rss_peak,
        "rss_bytes_per_history_token": (rss_final - rss_baseline) / max(stats["tokens"], 1),
        "push_seconds_mean": float(np.mean(push_seconds)), "push_seconds_max": float(np.max(push_seconds)),
        "state_dict_seconds": state_seconds, "digest_seconds": digest_seconds,
        "seconds": time.perf_counter() - started,
    }


def run_recorded(path: str, window: int = 16, budget: int | None = None, backend: str = "native",
                 max_tree_depth: int | None = None) -> dict:
    """Push a recorded rollouts file step by step (each recorded ``step`` one ``add_rollouts`` call, oldest first, as
    the trainer pushes) and measure the history's memory.

    Args:
        path: a rollouts JSONL file (``das_trl.drafter.rollout_log``; ``.gz`` read as such).
        window, budget: the drafter's ``window`` and ``history_token_budget`` (None: ``DrafterConfig``'s, 8M).
        backend, max_tree_depth: as for :func:`run`.

    Returns:
        ``dict`` with ``rollouts`` (the path), ``window``, ``budget``, ``steps``, ``pushed_tokens``,
        ``max_history_tokens``, ``budget_held``, ``history_tokens``, ``history_problems``, ``history_approx_bytes``,
        ``backend``, ``max_tree_depth``, ``bytes_per_history_token`` (None for the reference), ``rss_baseline_bytes``,
        ``rss_final_bytes``, ``rss_peak_bytes``, ``rss_bytes_per_history_token``, ``seconds``.

    Raises:
        FileNotFoundError / ValueError: the file is missing or not a rollouts file (the message names the line).
    """
    from das_trl.drafter.rollout_log import read_records

    started = time.perf_counter()
    steps: dict[int, list] = {}
    for record in read_records(path):
        steps.setdefault(record.step, []).append(record)
    if not steps:
        raise ValueError(f"{path}: no rollouts in the file")
    config = DrafterConfig(window=window, backend=backend,
                           **({} if budget is None else {"history_token_budget": budget}),
                           **({} if max_tree_depth is None else {"max_tree_depth": max_tree_depth}))
    drafter = create_drafter(config)
    gc.collect()
    rss_baseline = rss_peak = _rss()
    pushed_tokens = max_tokens = 0
    for step in sorted(steps):
        records = steps[step]
        added = drafter.add_rollouts([r.prompt_ids for r in records], [r.completion_ids for r in records],
                                     [r.problem_key for r in records])
        pushed_tokens += added["tokens"]
        max_tokens = max(max_tokens, drafter.stats()["tokens"])
        rss_peak = max(rss_peak, _rss())
    stats = drafter.stats()
    rss_final = _rss()
    return {
        "rollouts": str(path), "window": window, "budget": config.history_token_budget, "steps": len(steps),
        "pushed_tokens": pushed_tokens, "max_history_tokens": max_tokens,
        "budget_held": max_tokens <= config.history_token_budget, "history_tokens": stats["tokens"],
        "history_problems": stats["problems"], "history_approx_bytes": stats["approx_bytes"], "backend": backend,
        "max_tree_depth": config.max_tree_depth, "bytes_per_history_token": stats.get("bytes_per_history_token"),
        "rss_baseline_bytes": rss_baseline, "rss_final_bytes": rss_final, "rss_peak_bytes": rss_peak,
        "rss_bytes_per_history_token": (rss_final - rss_baseline) / max(stats["tokens"], 1),
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    """Command line; returns 0 when the budget held, evictions were counted and were oldest-first (with
    ``--rollouts``: when the budget held), 1 when not, 2 for a rollouts file that cannot be read."""
    ap = argparse.ArgumentParser(prog="das-trl bench history-memory", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=positive_int, default=64, help="problems (default %(default)s)")
    ap.add_argument("--samples", type=positive_int, default=16,
                    help="sibling completions per appearance (default %(default)s)")
    ap.add_argument("--appearances", type=positive_int, default=4,
                    help="appearances (RL epochs) of every problem (default %(default)s)")
    ap.add_argument("--length", type=positive_int, default=128, help="longest completion, tokens (default %(default)s)")
    ap.add_argument("--window", type=positive_int, default=16,
                    help="the drafter's window: appearances kept per problem (default %(default)s)")
    ap.add_argument("--budget", type=positive_int, default=None,
                    help="history_token_budget (default 200,000 for the synthetic run, 8M with --rollouts)")
    ap.add_argument("--rollouts", default=None,
                    help="push this recorded rollouts file (JSONL, .gz too) step by step instead of a synthetic run")
    ap.add_argument("--problems-per-step", type=positive_int, default=64,
                    help="problems per push (GRPO step; default %(default)s)")
    ap.add_argument("--seed", type=non_negative_int, default=0, help="default %(default)s")
    ap.add_argument("--backend", choices=("native", "python"), default="native",
                    help="the drafter: native (the engine's, default) or python (the reference; needs arctic-inference)")
    ap.add_argument("--max-tree-depth", type=positive_int, default=None,
                    help="the drafter's tree depth (default: DrafterConfig's, 64)")
    ap.add_argument("--json", type=output_file, default=None, help="also write the result to this file")
    args = ap.parse_args(argv)
    if args.rollouts is not None:
        try:
            if not os.path.isfile(args.rollouts):  # named before the drafter is built, as bench replay names it
                raise FileNotFoundError(f"--rollouts {args.rollouts}: "
                                        f"{'a directory' if os.path.isdir(args.rollouts) else 'no such file'}; give a "
                                        "rollouts file (JSONL, .gz too): das_record_rollouts writes one, "
                                        "benchmarks/sets/ has recorded ones")
            result = run_recorded(args.rollouts, args.window, args.budget, args.backend, args.max_tree_depth)
        except (OSError, ValueError) as exc:
            from das_trl.cli import _bad_input  # the one-line error every das-trl command prints

            return _bad_input("das-trl bench history-memory", exc)
    else:
        result = run(args.problems, args.samples, args.appearances, args.length, args.window,
                     200_000 if args.budget is None else args.budget, args.problems_per_step, seed=args.seed,
                     verbose=True, backend=args.backend, max_tree_depth=args.max_tree_depth)
    print(json.dumps(result, indent=1))
    if result["bytes_per_history_token"] is not None:
        print(f"native core, depth {result['max_tree_depth']}: history automata "
              f"{result['bytes_per_history_token']:.1f} B per history token")
    print(f"RSS per history token: {result['rss_bytes_per_history_token']:.1f} B "
          f"(history {result['history_tokens']:,} tokens; approx_bytes {result['history_approx_bytes'] / 2**20:.0f} "
          f"MiB; RSS +{(result['rss_final_bytes'] - result['rss_baseline_bytes']) / 2**20:.0f} MiB, peak "
          f"+{(result['rss_peak_bytes'] - result['rss_baseline_bytes']) / 2**20:.0f} MiB)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.rollouts is not None:
        print("OK: budget held" if result["budget_held"] else "FAILED: the history exceeded its budget")
        return 0 if result["budget_held"] else 1
    ok = result["budget_held"] and result["evictions_counted"] and result["oldest_first"]
    print("OK: budget held, evictions counted, oldest-first" if ok else "FAILED: see budget_held / "
          "evictions_counted / oldest_first")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
