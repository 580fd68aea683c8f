"""The CPU of a new batch's first engine step on the native drafter: ``--rows`` requests (groups of 8 sharing one
``--prompt``-token prompt, after a history push of the same problems) are started, then one step gives
``--drafting`` of them a budget. With ``defer_idle_rows`` (the default) that step builds only the drafting requests'
automata and leaves the idle ones' prompts to the ingest thread (``docs/native-core.md``, "Deferred ingest").

    python scripts/bench_first_step.py [--rows 128 560] [--prompt 200 1000] [--drafting 0 8 140] [--batches 7]

Prints, per configuration, the median thread CPU of a start (us per request) and of the first step (ms) over
``--batches`` batches; no vLLM needed. Thread CPU on the calling thread, the engine's critical path: the ingest
thread's work is not in it."""

from __future__ import annotations

import argparse
import time

import numpy as np

from das_trl.drafter import DrafterConfig, create_drafter


def first_step(rows: int, prompt_len: int, drafting: int, batches: int, seed: int = 0) -> tuple[float, float]:
    """``(us per start, ms of the first step)``, medians over ``batches`` batches of ``rows`` requests."""
    rng = np.random.default_rng(seed)
    d = create_drafter(DrafterConfig(backend="native", draft_threads=1))
    prompts = [rng.integers(0, 32000, prompt_len).tolist() for _ in range(max(1, rows // 8))]
    d.add_rollouts([p for p in prompts for _ in range(8)],
                   [rng.integers(0, 32000, 400).tolist() for _ in range(8 * len(prompts))])
    starts, steps = [], []
    for b in range(batches):
        ids = [f"b{b}r{i}" for i in range(rows)]
        matrix = np.zeros((rows, prompt_len + 1), np.int32)
        for i in range(rows):
            matrix[i, :prompt_len] = prompts[i // 8 % len(prompts)]
            matrix[i, prompt_len] = rng.integers(0, 32000)  # the first sampled token
        t = time.thread_time()
        for i, rid in enumerate(ids):
            d.start_request(rid, matrix[i, :prompt_len])
        starts.append((time.thread_time() - t) / rows)
        budgets = np.zeros(rows, np.int32)
        budgets[rng.choice(rows, min(drafting, rows), replace=False)] = 16
        t = time.thread_time()
        d.step(ids, matrix, np.arange(rows, dtype=np.int32), np.full(rows, prompt_len + 1, np.int32),
               np.full(rows, prompt_len, np.int32), np.ones(rows, np.int32), np.full(rows, -1, np.int32), budgets)
        steps.append(time.thread_time() - t)
        for rid in ids:
            d.stop_request(rid)
    return 1e6 * float(np.median(starts)), 1e3 * float(np.median(steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 560])
    ap.add_argument("--prompt", type=int, nargs="+", default=[200, 1000], help="prompt tokens, one per --rows entry")
    ap.add_argument("--drafting", type=int, nargs="+", default=[0, 8, 140])
    ap.add_argument("--batches", type=int, default=7)
    args = ap.parse_args()
    if len(args.prompt) != len(args.rows):
        ap.error("--prompt needs one length per --rows entry")
    print(f"{'rows':>6}{'prompt':>8}{'drafting':>10}{'us/start':>10}{'first step ms':>15}")
    for rows, prompt_len in zip(args.rows, args.prompt):
        for drafting in args.drafting:
            us, ms = first_step(rows, prompt_len, drafting, args.batches)
            print(f"{rows:>6}{prompt_len:>8}{drafting:>10}{us:>10.1f}{ms:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
