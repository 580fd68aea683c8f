"""Cost of one :meth:`BudgetController.budgets` call (the per-engine-step controller) on this machine.

It runs on the engine's critical path once per step, after drafting, so its time adds to every step. Synthetic
inputs: ``--problems`` problems with 64 history lengths each, a batch of ``--batch`` rows from them, drafts of
width ``--k`` with decaying acceptance estimates. Reports the median and p90 over ``--repeats`` calls, per call and
per row. ``--backend`` is ``ControllerConfig.backend``: ``auto`` (the default: the native kernel when the drafter's
core is built), ``native`` (the kernel; an error without the core) or ``python`` (the numpy reference); the first
line printed says which one ran.

CLI::

    das-trl bench controller-speed [--batch 64,256,1024] [--k 16] [--problems 2000] [--repeats 200]
                                   [--backend auto|native|python]
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np

from das_trl.bench.options import positive_int, positive_int_list
from das_trl.budget import BudgetController, ControllerConfig


def measure(batch: int, k: int, problems: int, repeats: int, seed: int = 0, backend: str = "auto") -> dict:
    """Median / p90 time (ms) of one ``budgets`` call for ``batch`` rows; ``ran``: ``"native"`` or ``"numpy"``."""
    rng = np.random.default_rng(seed)
    ctl = BudgetController(ControllerConfig(cost_source="config", backend=backend))
    for key in range(problems):
        ctl.observe(key, rng.integers(50, 2000, 64).tolist())
    keys = rng.integers(0, problems, batch)
    out_len = rng.integers(0, 1500, batch)
    rounds = out_len // 2
    acc = np.sort(rng.random((batch, k)), axis=1)[:, ::-1].copy()
    ctl.budgets(acc, keys, out_len, rounds)  # builds the length table once
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ctl.budgets(acc, keys, out_len, rounds, np.full(batch, 2048))
        times.append(1000.0 * (time.perf_counter() - t0))
    med, p90 = float(np.median(times)), float(np.quantile(times, 0.9))
    ran = ctl.backend_in_use
    return {"batch": batch, "k": k, "median_ms": med, "p90_ms": p90, "us_per_row": 1000.0 * med / batch, "ran": ran}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="das-trl bench controller-speed",
                                description="Cost of one BudgetController.budgets call (the per-engine-step "
                                            "controller) on this machine.")
    p.add_argument("--batch", type=positive_int_list, default="64,256,1024",
                   help="batch sizes to time, comma-separated, each >= 1 (default %(default)s)")
    p.add_argument("--k", type=positive_int, default=16,
                   help="draft width: acceptance estimates per row, >= 1 (default %(default)s)")
    p.add_argument("--problems", type=positive_int, default=2000,
                   help="synthetic problems the rows are drawn from, each with 64 history lengths, >= 1 "
                        "(default %(default)s)")
    p.add_argument("--repeats", type=positive_int, default=200,
                   help="timed calls per batch size, >= 1; the median and p90 are over these (default %(default)s)")
    p.add_argument("--backend", choices=("auto", "native", "python"), default="auto",
                   help="ControllerConfig.backend: auto (native kernel when built), native, python (numpy reference)")
    args = p.parse_args(argv)
    for i, b in enumerate(args.batch):
        r = measure(b, args.k, args.problems, args.repeats, backend=args.backend)
        if i == 0:
            print(f"backend {args.backend}: the {'native kernel' if r['ran'] == 'native' else 'numpy reference'}")
        print(f"batch {r['batch']:>5}  K {r['k']:>3}  median {r['median_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  "
              f"({r['us_per_row']:.2f} us per row)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
