"""One history push: a step's rollouts into an engine's drafter history, checked against the trainer's mirror.

Shared by :class:`~das_trl.trainer.DASGRPOTrainer` (at each optimizer step's end) and the asynchronous trainer's
rollout worker (:mod:`das_trl.trainer.async_grpo`, at each weight sync), so both send the same payload, run the same
digest check and repair, and log the same ``das/*`` metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from das_trl.trainer.callback import DASHistoryMirror
from das_trl.vllm.client import DASEngine, DASEngineError, PartialEngineError

logger = logging.getLogger(__name__)

# Proposer counters whose per-push differences become das/* metrics; the budget source's own counters (named in
# stats()["budget_counters"]) are added to these, and its other budget_* values are logged as they are.
COUNTERS = ("request_rounds", "drafts", "draft_tokens", "accepted_tokens", "verified_drafts", "speculation_seconds")


def push_history(engine: DASEngine, mirror: DASHistoryMirror, prompts: Sequence[Sequence[int]],
                 completions: Sequence[Sequence[int]], problem_keys: Sequence[int] | None, *, stale: bool,
                 last_counters: dict[str, float]) -> tuple[dict[str, float], bool]:
    """Push rollouts that ``mirror`` already holds into ``engine``, then check every worker's digest against it.

    A stale engine (start, failed push) gets the whole mirror instead of the rollouts. An engine whose digest differs
    after the push gets the mirror reloaded (``das/history_repairs`` = 1). A failed push is a warning, not an error:
    training continues and the returned ``stale`` is True, so the next push reloads the whole mirror.

    Args:
        engine: the engine (in-process or a server).
        mirror: the trainer-side history, with these rollouts already recorded.
        prompts, completions: token ids per rollout (may be empty: only the check and the metrics run).
        problem_keys: explicit key per rollout, or ``None`` (the engine hashes the prompts).
        stale: whether the engine's history may differ from the mirror.
        last_counters: the proposer's counters at the previous push; updated in place.

    Returns:
        ``(metrics, stale)``: ``das/*`` metrics of this push, and whether the next push must reload the mirror.
    """
    metrics: dict[str, float] = {}
    try:
        stats_before = engine.stats()
        started = time.perf_counter()
        if stale:
            reply = engine.load_history(mirror.state())
            metrics["das/history_reloads"] = 1.0
        elif prompts:
            try:
                reply = engine.add_history(prompts, completions, problem_keys)
            except PartialEngineError as exc:
                # Some data-parallel engines took the push and others did not: their digests now differ from the
                # mirror's, and the check below reloads the mirror into every engine at once.
                logger.warning("DAS history push reached only some engines (repairing now): %s", exc)
                reply = {"stats": stats_before}
        else:
            reply = {"stats": stats_before}
        stale = False
        metrics["das/history_repairs"] = float(verify_engine_history(engine, mirror))
        metrics["das/history_update_seconds"] = time.perf_counter() - started
        stats = engine.stats() if metrics["das/history_repairs"] else reply["stats"]
        if "drafter_backend" in stats:  # the engine's own word (a server's drafter)
            metrics["das/native_core"] = float(stats["drafter_backend"] == "native")
        metrics.update(verification_metrics(stats))
        metrics.update(counter_metrics(stats_before, last_counters))
        metrics.update({
            "das/history_problems": stats.get("history_problems", 0),
            "das/history_tokens": stats.get("history_tokens", 0),
            "das/history_bytes": stats.get("history_bytes", 0),
            # The live pool at the end of the generation, before the push released the pushed problems' finished
            # outputs (bounded by das_live_token_budget); evictions are cumulative.
            "das/live_running_tokens": stats_before.get("live_running_tokens", 0),
            "das/live_finished_tokens": stats_before.get("live_finished_tokens", 0),
            "das/live_bytes": stats_before.get("live_approx_bytes", 0),
            "das/live_evicted_outputs": stats_before.get("live_evicted_outputs", 0),
        })
    except DASEngineError as exc:
        logger.warning("DAS history push failed (training continues; the next push reloads the whole history into "
                       "the engine): %s", exc)
        stale = True
        metrics["das/history_push_failures"] = 1.0
    return {k: float(v) for k, v in metrics.items()}, stale


def verify_engine_history(engine: DASEngine, mirror: DASHistoryMirror) -> bool:
    """Compare every worker's history digest with the mirror's; reload the mirror into a diverged engine.

    Returns:
        True if the engine had diverged and was repaired.

    Raises:
        DASEngineError: the engine cannot be asked, or still differs after the reload.
    """
    expected = mirror.digest()
    digests = engine.labelled_history_digests()
    if all(d == expected for d in digests.values()):
        return False
    diverged = {label: d for label, d in digests.items() if d != expected}
    logger.warning("DAS history of %s diverged from the trainer's (%s; expected %s): reloading the trainer's history "
                   "into every engine", engine.name, diverged, expected)
    engine.load_history(mirror.state())
    digests = engine.labelled_history_digests()
    if any(d != expected for d in digests.values()):
        raise DASEngineError(f"{engine.name}: history still differs from the trainer's after a reload "
                             f"(worker digests {digests}, expected {expected})")
    return True


def verification_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """The engine's verification limits as ``das/*`` metrics: ``das/verification_patched`` (1: logprobs at the
    verified positions only, 0: vLLM's padded rows x (longest draft + 1)), ``das/verify_draft_limit`` and
    ``das/verify_draft_len_limit`` (the most draft tokens per step and per row the profiled shape allows; absent:
    no limit), ``das/peak_step_drafts`` and ``das/peak_draft_len`` (the most sent so far)."""
    out = {}
    if "verification_shape" in stats:
        out["das/verification_patched"] = float(stats["verification_shape"] == "patched")
    for key in ("verify_draft_limit", "verify_draft_len_limit", "peak_step_drafts", "peak_draft_len"):
        if isinstance(stats.get(key), (int, float)) and not isinstance(stats.get(key), bool):
            out[f"das/{key}"] = float(stats[key])
    return out


def counter_metrics(stats: dict[str, Any], last_counters: dict[str, float]) -> dict[str, float]:
    """Differences of the proposer's counters since ``last_counters`` (updated in place), as ``das/*`` metrics; the
    budget source's diagnostics as ``das/budget/<name>`` (differences for its counters, values for the rest)."""
    budget_counters = [k for k in stats.get("budget_counters", []) if isinstance(stats.get(k), (int, float))]
    keys = (*COUNTERS, *budget_counters)
    delta = {k: float(stats.get(k, 0)) - last_counters.get(k, 0.0) for k in keys}
    last_counters.clear()
    last_counters.update({k: float(stats.get(k, 0)) for k in keys})
    rounds = delta["request_rounds"]
    budget = {f"das/budget/{k[len('budget_'):]}": (delta[k] if k in delta else float(v))
              for k, v in stats.items()
              if k.startswith("budget_") and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {
        **budget,
        "das/draft_tokens": delta["draft_tokens"],
        "das/accepted_tokens": delta["accepted_tokens"],
        "das/acceptance_rate": delta["accepted_tokens"] / delta["draft_tokens"] if delta["draft_tokens"] else 0.0,
        "das/tokens_per_round": (rounds + delta["accepted_tokens"]) / rounds if rounds else 1.0,
        "das/speculated_share": delta["drafts"] / rounds if rounds else 0.0,
        "das/speculation_seconds": delta["speculation_seconds"],
    }
