"""The proposer's wall time per engine step against ``draft_threads`` (DrafterConfig), on recorded replay sets.

    python recipes/gpu/draft_threads.py OUT.json SET.jsonl[.gz] ...     # env THREADS=1,2,4,8,16  C_TOK=0.025

For a machine with more cores than das-trl's 2-core development machine (the GPU machine's 16): each set is
replayed (``das_trl.bench.simulation.simulate``, the ``das+controller`` drafter, cost model 7 ms + ``C_TOK`` ms per
token, das-trl's verification logprobs) once per thread count and once more with the first count (the drift between
the first and the last run is the spread to read the others against). Every run is timed by the wall clock, one
thread included (``DrafterConfig.draft_threads`` > 1 drafts on worker threads, whose CPU a thread clock would miss).
Drafts do not depend on the thread count: tokens per round is the same on every line of a set.

Printed and written per run: rows per engine step, tokens per round, the proposer's wall us per step and per
request-round, time with the proposer / none and without it. Needs an installed das-trl (the native core built)
and numpy; nothing of vLLM, TRL or torch.
"""

from __future__ import annotations

import json
import os
import sys
import time

from das_trl.bench.drafters import controller_config, make_drafter
from das_trl.bench.sets import load_epochs, split_epochs
from das_trl.bench.simulation import simulate
from das_trl.budget.cost_model import ASSUMED_C_LOGPROB_MS

C_BASE_MS = 7.0


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage:", __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    threads = [int(x) for x in os.environ.get("THREADS", "1,2,4,8,16").split(",")]
    c_tok = float(os.environ.get("C_TOK", "0.025"))
    out = []
    for path in argv[1:]:
        train, evals, _, _ = split_epochs(load_epochs(path), None, None)
        none = simulate(make_drafter("none"), train, evals, C_BASE_MS, c_tok, c_logprob=ASSUMED_C_LOGPROB_MS)
        for n in threads + [threads[0]]:
            d = make_drafter("das+controller", draft_threads=n, controller_config=controller_config(
                C_BASE_MS, c_tok, {}, ASSUMED_C_LOGPROB_MS, "patched"))
            d.wall_timed = True  # every thread count on the same clock
            t0 = time.perf_counter()
            r = simulate(d, train, evals, C_BASE_MS, c_tok, c_logprob=ASSUMED_C_LOGPROB_MS)
            x = dict(set=os.path.basename(path).split(".")[0], threads=n, c_tok=c_tok, steps=r.steps,
                     rows_per_step=r.rounds / max(1, r.steps), tokens_per_round=r.tokens_per_round,
                     us_per_step=1e6 * sum(r.proposer_seconds) / r.steps,
                     us_per_request_round=1e6 * sum(r.proposer_seconds) / r.rounds,
                     drafted_rows=r.counters.get("speculated_rows"),
                     time_nocpu_vs_none=r.time_at(C_BASE_MS, c_tok) / none.time_at(C_BASE_MS, c_tok),
                     time_cpu_vs_none=r.time_with_cpu(C_BASE_MS, c_tok) / none.time_at(C_BASE_MS, c_tok),
                     replay_s=time.perf_counter() - t0)
            out.append(x)
            print(f"{x['set']:36s} threads {n:2d} rows/step {x['rows_per_step']:7.1f} tpr {x['tokens_per_round']:.4f}"
                  f" wall us/step {x['us_per_step']:9.1f} us/req-rd {x['us_per_request_round']:6.2f} with CPU / none "
                  f"{x['time_cpu_vs_none']:.4f} (without {x['time_nocpu_vs_none']:.4f}) [{x['replay_s']:.1f} s]",
                  flush=True)
            with open(argv[0], "w") as f:  # after every run: a timed-out call keeps what it measured
                json.dump(dict(host=os.uname().nodename, cpus=os.cpu_count(), points=out), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
