"""The CPU of ``DASProposer.propose``'s own glue per engine step: what it does around the ``Speculator`` call (the
lengths of vLLM's sampled-token lists, the row arrays, the request bookkeeping, one new draft list per row), with
that call replaced by one that returns no draft, so only the glue is timed. The replay (``das-trl bench replay`` /
``suite``) times the ``Speculator``'s calls, not this (``docs/benchmarks.md``, "What is measured").

    python scripts/bench_proposer_glue.py [--rows 70 128 256] [--steps 300]

Prints the median thread CPU per call (us) per batch size; no vLLM needed (a stand-in model runner holds the arrays
vLLM's ``input_batch`` would)."""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np

from das_trl.drafter.draft_batch import DraftBatch
from das_trl.vllm.filled_views import FilledViews
from das_trl.vllm.proposer import DASProposer


class _NoDraftSpeculator:
    """Stands in for the ``Speculator``: every row tracked, every step returns no draft."""

    drafted = False

    def __init__(self, req_ids: list[str], k: int) -> None:
        self.req_ids = req_ids
        self.out = DraftBatch.empty(len(req_ids), k)

    def tracked(self) -> list[str]:
        return list(self.req_ids)

    def finish(self, req_id: str) -> None:
        pass

    def __contains__(self, req_id: str) -> bool:
        return True

    def __len__(self) -> int:
        return len(self.req_ids)

    def step(self, *args) -> DraftBatch:
        return self.out


def glue_us(rows: int, steps: int, k: int = 64) -> float:
    """Median thread CPU (us) of one ``propose`` call on ``rows`` decoding rows, nothing drafted."""
    req_ids = [f"{i}-{'0' * 8}" for i in range(rows)]
    proposer = DASProposer.__new__(DASProposer)  # the glue only: no drafter or controller is built
    proposer._counters = dict(rounds=0, unattached_rounds=0, speculation_seconds=0.0)
    proposer._clock, proposer._step_end, proposer._history_pending = time.perf_counter, None, False
    proposer._last_req_ids, proposer._all_rows, proposer._filled = [], np.zeros(0, np.int32), FilledViews()
    proposer.speculator = _NoDraftSpeculator(req_ids, k)
    width = max(1024, rows)
    batch = SimpleNamespace(req_ids=req_ids, num_prompt_tokens=np.full(width, 100, np.int32))
    proposer._runner = SimpleNamespace(input_batch=batch, requests={},
                                       num_decode_draft_tokens=SimpleNamespace(np=np.full(width, -1, np.int32)))
    num_tokens = np.full(width, 200, np.int32)
    token_ids = np.zeros((width, 256), np.int32)
    times = []
    for _ in range(steps):
        sampled = [[5] for _ in range(rows)]  # vLLM's per-row lists, one token each (no draft was verified)
        t0 = time.thread_time()
        proposer.propose(sampled, num_tokens, token_ids)
        times.append(time.thread_time() - t0)
    return float(np.median(times[steps // 5:])) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[70, 128, 256])
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    for rows in a.rows:
        print(f"{rows:5d} rows: DASProposer.propose glue {glue_us(rows, a.steps):6.2f} us per engine step (median)")


if __name__ == "__main__":
    main()
