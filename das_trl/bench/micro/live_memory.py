"""Benchmark: the drafter's live pool stays bounded by its token budget (docs/reliability.md, "Memory is bounded").

Runs a stream of requests through the public drafter API (reference or native, ``--backend``) with no history push at
all (an evaluation pass, or a trainer that never pushes): ``--requests`` requests, each its own problem, one after
another: ``start_request`` with a random ``--prompt``-token prompt, ``extend_request`` with ``--output`` random tokens
in pieces of ``--piece``, ``stop_request``. Finished outputs stay visible to siblings and to the batch tree until their
problem is pushed, which here never happens, so only ``DrafterConfig.live_token_budget`` bounds them.

After every stop it checks ``stats()["live_finished_tokens"] <= budget`` and records the largest value; it reports the
process's resident memory (psutil RSS) growth over the run, the pool's own ``live_approx_bytes`` and the RSS growth
per live-tree token. Random tokens share no tree paths: the worst case for bytes per token.

The input of docs/reliability.md's live-pool table (2,000 requests x 1,000 tokens, there with ``--backend native``;
about 1.5 GB of RSS before the budget existed)::

    python -m das_trl.bench.micro.live_memory --requests 2000 --output 1000

``--budget -1`` runs without eviction (budget larger than the input: how memory grew before the budget) and gives
the bytes per token. Prints one JSON object; exits 1 when the budget was exceeded.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import numpy as np

from das_trl.bench.options import non_negative_int, positive_int
from das_trl.drafter import DrafterConfig, create_drafter


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def run(requests: int = 2000, prompt: int = 64, output: int = 1000, piece: int = 50, budget: int | None = None,
        seed: int = 0, backend: str = "python") -> dict:
    """Run the input once in this process and measure it.

    Args:
        requests: requests started and stopped one after another (each its own problem).
        prompt: prompt tokens per request. output: output tokens per request, added ``piece`` at a time.
        budget: ``DrafterConfig.live_token_budget`` (``None``: the default; a negative value: larger than the
            whole input, so nothing is evicted).
        seed: token generator seed.
        backend: ``DrafterConfig.backend`` (``"python"``: the reference drafter; ``"native"``: the C++ core).

    Returns:
        ``dict`` with ``budget``, ``input_tokens`` (output tokens in all), ``max_finished_tokens`` (largest
        ``live_finished_tokens`` seen after a stop), ``budget_held`` (bool), the final ``stats`` of the live pool
        (``live_*`` keys, ``lingering_finished``), ``rss_start_bytes``, ``rss_growth_bytes``,
        ``peak_live_tree_tokens``, ``rss_bytes_per_tree_token`` (growth / peak live-tree tokens; ``None`` when 0) and
        ``seconds``.

    Raises:
        ValueError: a size < 1 (``piece``, ``requests``, ``output``) or ``prompt < 1``.
    """
    for name, value in (("requests", requests), ("prompt", prompt), ("output", output), ("piece", piece)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if budget is not None and budget < 0:
        budget = requests * (output + prompt) + 1
    config = DrafterConfig(backend=backend) if budget is None else DrafterConfig(live_token_budget=budget,
                                                                                 backend=backend)
    rng = np.random.default_rng(seed)
    drafter = create_drafter(config)
    gc.collect()
    rss_start = _rss()
    started = time.perf_counter()
    max_finished = peak_tree = 0
    for i in range(requests):
        rid = f"r{i}"
        drafter.start_request(rid, rng.integers(0, 49152, prompt, dtype=np.int32))
        tokens = rng.integers(0, 49152, output, dtype=np.int32)
        for start in range(0, output, piece):
            drafter.extend_request(rid, tokens[start:start + piece])
        peak_tree = max(peak_tree, drafter.stats()["live_tree_tokens"])
        drafter.stop_request(rid)
        stats = drafter.stats()
        max_finished = max(max_finished, stats["live_finished_tokens"])
    seconds = time.perf_counter() - started
    gc.collect()
    growth = _rss() - rss_start
    stats = {k: v for k, v in drafter.stats().items() if k.startswith("live_") or k == "lingering_finished"}
    return {
        "budget": config.live_token_budget,
        "input_tokens": requests * output,
        "max_finished_tokens": max_finished,
        "budget_held": max_finished <= config.live_token_budget,
        "stats": stats,
        "rss_start_bytes": rss_start,
        "rss_growth_bytes": growth,
        "peak_live_tree_tokens": peak_tree,
        "rss_bytes_per_tree_token": growth / peak_tree if peak_tree else None,
        "seconds": round(seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m das_trl.bench.micro.live_memory``: print :func:`run`'s result as JSON; 1 when the budget was
    exceeded."""
    p = argparse.ArgumentParser(prog="das_trl.bench.micro.live_memory", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=positive_int, default=2000, help="requests (default %(default)s)")
    p.add_argument("--prompt", type=positive_int, default=64, help="prompt tokens per request (default %(default)s)")
    p.add_argument("--output", type=positive_int, default=1000, help="output tokens per request (default %(default)s)")
    p.add_argument("--piece", type=positive_int, default=50,
                   help="output tokens per extend_request call (default %(default)s)")
    p.add_argument("--budget", type=int, default=None,
                   help="live_token_budget (default: DrafterConfig's; negative: no eviction)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="default %(default)s")
    p.add_argument("--backend", choices=("python", "native"), default="python")
    args = p.parse_args(argv)
    result = run(args.requests, args.prompt, args.output, args.piece, args.budget, args.seed, args.backend)
    print(json.dumps(result), flush=True)
    return 0 if result["budget_held"] else 1


if __name__ == "__main__":
    sys.exit(main())
