"""Live A/B benchmark: the same rollout batch through a real vLLM engine once per drafter (none, ngram, suffix, DAS).

The driver and the command line (``das-trl bench live``); the procedure is in :mod:`das_trl.bench.live`. Every
engine runs in a fresh spawned process, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from das_trl.bench.live.config import DRAFTERS, VLLM_DTYPES, LiveConfig, engine_seed
from das_trl.bench.live.engine import (BatchResult, build_engine, counter_delta, engine_async_scheduling,
                                       is_cpu_platform, run_batch, sampling_params, sampling_warnings,
                                       shutdown_engine, spec_counters, speculative_kwargs)
from das_trl.bench.live.history import generate_history, load_prompts, push_history
from das_trl.bench.live.report import TIERS_NOTE, WALL_TIME_NOTE, DrafterReport, format_table, make_report, write_plot
from das_trl.bench.options import drafter_names, json_overrides
from das_trl.drafter import DrafterConfig


def run_drafter(cfg: LiveConfig, model: str, drafter: str, cpu: bool, prompts: list[list[int]],
                hist_prompts: list[list[int]], hist_completions: list[list[int]], generate: bool,
                temperature: float, deadline: float | None) -> dict[str, Any]:
    """Build ``drafter``'s engine, give it the history (generating it first when ``generate``), run the batch.

    Returns:
        ``{"batch": BatchResult, "spec": counter_delta(...), "das_stats": dict | None, "push": dict | None,
        "history": (prompts, completions) | None, "async_scheduling": bool | None}`` (``history`` only when
        generated here; ``async_scheduling`` as the engine resolved it).
    """
    llm = build_engine(cfg, model, drafter, cpu)
    try:
        history = None
        if generate:
            history = generate_history(llm, cfg, prompts)
            hist_prompts, hist_completions = history
        # A suffix engine that generated the history has it in its cache already.
        push = None
        if not (generate and drafter == "suffix"):
            push = push_history(llm, drafter, hist_prompts, hist_completions, cfg.das_config)
        before = spec_counters(llm)
        params = sampling_params(temperature, cfg.max_tokens)
        batch = run_batch(llm, prompts, cfg.samples, params, tag=f"live-{drafter}", deadline=deadline)
        spec = counter_delta(spec_counters(llm), before)
        das_stats = None
        if drafter == "das":
            from das_trl.vllm.client import LocalDASEngine

            das_stats = LocalDASEngine(llm).stats()
        return {"batch": batch, "spec": spec, "das_stats": das_stats, "push": push, "history": history,
                "async_scheduling": engine_async_scheduling(llm)}
    finally:
        shutdown_engine(llm)


def run_drafter_isolated(*args: Any) -> dict[str, Any]:
    """:func:`run_drafter` in a fresh (spawned) process, so every engine starts from a clean interpreter.

    Building a second in-process engine after vLLM's ``ngram`` proposer imported numba fails in vLLM 0.32's CPU
    kernel registration (``'_lib_fn_wrapper' object has no attribute 'get'``, ``triton_utils/dispatcher.py``); a
    process per engine also returns all of its memory.

    Raises:
        whatever :func:`run_drafter` raised in the child.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_drafter, *args).result()


def _log(message: str) -> None:
    # Flushed at once: vLLM forks helper processes, which would print a block-buffered stdout again.
    print(message, flush=True)


def run_live(cfg: LiveConfig, log=_log) -> dict[str, Any]:
    """Run the A/B and return the JSON-able result (see the module docstring; ``ok`` is False if a check failed).

    Raises:
        ValueError: unknown drafter, or a history file with too few problems.
    """
    import vllm

    for d in cfg.drafters:
        speculative_kwargs(d, cfg.num_speculative_tokens)  # validates the name
    deadline = time.time() + cfg.time_limit_s if cfg.time_limit_s else None
    model = cfg.model
    if model is None:
        from das_trl.defaults.model import prepare_default_model

        model = prepare_default_model()
    cpu = is_cpu_platform()
    prompts, records = load_prompts(cfg, model)
    temperature = 0.0 if cfg.greedy else cfg.temperature
    params = sampling_params(temperature, cfg.max_tokens)
    batch_size = len(prompts) * cfg.samples
    warnings: list[str] = []
    for d in cfg.drafters:
        spec = speculative_kwargs(d, cfg.num_speculative_tokens).get("speculative_config")
        warnings += [f"{d}: {w}" for w in sampling_warnings(params, spec, batch_size, cpu)]
    for w in warnings:
        log(f"[das-trl bench live] WARNING {w}")
    if cpu and temperature > 0 and os.environ.get("DAS_TRL_CPU_SAMPLER_FIX") == "0":
        warnings.append("DAS_TRL_CPU_SAMPLER_FIX=0: sampled speculation on the CPU build is not lossless")
    hist_prompts = [r.prompt_ids for r in records]
    hist_completions = [r.completion_ids for r in records]
    history_source = f"file {cfg.history}" if cfg.history else f"generated: {cfg.warm_epochs} epochs"
    reports: list[DrafterReport] = []
    reference: BatchResult | None = None
    for n, drafter in enumerate(cfg.drafters):
        if deadline is not None and time.time() > deadline:
            warnings.append(f"time limit reached before {drafter}: skipped")
            log(f"[das-trl bench live] time limit reached: skipping {drafter} and later drafters")
            break
        generate = n == 0 and not cfg.history and cfg.warm_epochs > 0
        log(f"[das-trl bench live] {drafter}: starting the engine (K={cfg.num_speculative_tokens})"
            + (f"; it first generates {cfg.warm_epochs} history epochs at T={cfg.temperature}" if generate else ""))
        run = run_drafter_isolated(cfg, model, drafter, cpu, prompts, hist_prompts, hist_completions, generate,
                                   temperature, deadline)
        if generate:
            hist_prompts, hist_completions = run["history"]
        batch, spec, das_stats = run["batch"], run["spec"], run["das_stats"]
        # DAS: its proposer counted what it proposed; suffix: it was given history.
        expect = {"das": bool(das_stats and das_stats.get("draft_tokens")),
                  "suffix": bool(hist_completions)}.get(drafter, False)
        report = make_report(drafter, cfg, batch, spec, reference, expect_drafts=expect)
        report.history_push = run["push"]
        report.das_stats = das_stats
        report.async_scheduling = run.get("async_scheduling")
        if das_stats is not None and (not das_stats.get("attached") or das_stats.get("unattached_rounds", 0)):
            report.errors.append("das: the proposer was not attached for the whole batch")
        if drafter == "none":
            reference = batch
        reports.append(report)
        log(f"[das-trl bench live] {drafter}: {batch.engine_steps} engine steps, "
            f"{report.tokens_per_round:.3f} tokens/round, {spec['num_accepted_tokens']} accepted draft tokens")
    errors = [e for r in reports for e in r.errors]
    hist_lengths = [len(c) for c in hist_completions]
    return {
        "benchmark": "das-trl bench live",
        "config": {**asdict(cfg), "model": model, "drafters": list(cfg.drafters), "batch_temperature": temperature},
        "platform": "cpu" if cpu else "gpu",
        "vllm_version": vllm.__version__,
        "wall_time_note": WALL_TIME_NOTE if cpu else "GPU wall time of the rollout batch",
        "tiers_note": TIERS_NOTE,
        "history": {"source": history_source, "rollouts": len(hist_completions),
                    "problems": len({tuple(p) for p in hist_prompts}), "tokens": int(sum(hist_lengths)),
                    "mean_length": float(np.mean(hist_lengths)) if hist_lengths else None},
        "warnings": warnings,
        "results": [asdict(r) for r in reports],
        "errors": errors,
        "ok": not errors and len(reports) == len(cfg.drafters),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options of ``das-trl bench live`` (``--help`` lists them)."""
    d = LiveConfig()
    p = argparse.ArgumentParser(prog="das-trl bench live", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model path (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafters", type=_drafters, default=",".join(DRAFTERS),
                   help=f"comma-separated subset of {','.join(DRAFTERS)} (default: all)")
    p.add_argument("--task", default=d.task, help="reasoning-gym task for the prompts (without --history)")
    p.add_argument("--prompts", type=int, default=d.prompts, help="problems in the batch")
    p.add_argument("--samples", type=int, default=d.samples, help="requests per problem (GRPO group size)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature (as in training)")
    p.add_argument("--greedy", action="store_true", help="run the batch at temperature 0 and check token identity")
    p.add_argument("--history", default=None, help="rollouts JSONL: history for DAS/suffix and the batch's prompts")
    p.add_argument("--warm-epochs", type=int, default=d.warm_epochs,
                   help="without --history: epochs of the same prompts generated first as history")
    p.add_argument("--num-speculative-tokens", type=_num_speculative_tokens, default=d.num_speculative_tokens,
                   help="K for every drafter (1 to 64, the native drafter core's cap; default %(default)s)")
    p.add_argument("--das-config", default=None, help="JSON object of DrafterConfig overrides for DAS")
    p.add_argument("--seed", type=engine_seed, default=d.seed, help="0 to 2**32 - 1 (default %(default)s)")
    p.add_argument("--dtype", choices=VLLM_DTYPES, default=d.dtype, help="vLLM's dtype (default %(default)s)")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--kv-cache-bytes", type=int, default=d.kv_cache_bytes, help="CPU build: KV cache size")
    p.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization, help="GPU builds")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--enforce-eager", choices=("auto", "yes", "no"), default="auto",
                   help="vLLM eager mode (auto: on for CPU builds, off for GPUs; yes skips CUDA-graph capture)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds; past it the running batch is aborted and later drafters skipped (reported)")
    p.add_argument("--out", default="runs/live", help="output folder: live.json, live.png, table.txt")
    return p.parse_args(argv)


def _drafters(text: str) -> str:
    """argparse ``type=`` of ``--drafters``: comma-separated names from :data:`DRAFTERS`, each once (an unknown name
    was refused only after vLLM was imported; a repeated one ran its drafter twice). Returns ``text`` unchanged."""
    try:
        drafter_names(text, DRAFTERS)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--drafters: ")) from None
    return text


def _num_speculative_tokens(text: str) -> int:
    """argparse ``type=`` of ``--num-speculative-tokens``: an int K that vLLM and the drafter can run (1 to 64 where
    the native core is built; :func:`~das_trl.vllm.engine.check_num_speculative_tokens`)."""
    from das_trl.vllm.engine import check_num_speculative_tokens

    try:
        return check_num_speculative_tokens(int(text), "K")
    except ValueError as exc:
        message = str(exc) if text.strip().lstrip("+-").isdigit() else f"must be an int, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def check_args(args: argparse.Namespace) -> None:
    """Refuse, before any engine starts, sizes vLLM would refuse only after its start-up and an ``--out`` that could
    not be written once the batches have run.

    Raises:
        ValueError: a count below 1 (``--prompts``, ``--samples``, ``--max-tokens``, ``--max-model-len``,
            ``--kv-cache-bytes``, ``--max-num-seqs``), ``--warm-epochs`` below 0, ``--temperature`` below 0 or not
            finite, ``--gpu-memory-utilization`` outside (0, 1], ``--time-limit`` not positive, or ``--out`` (or a
            folder above it) an existing file.
    """
    for flag in ("prompts", "samples", "max_tokens", "max_model_len", "kv_cache_bytes", "max_num_seqs"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: allowed 1 or more")
    if args.warm_epochs < 0:
        raise ValueError(f"--warm-epochs {args.warm_epochs}: allowed 0 or more")
    if not 0.0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature {args.temperature}: allowed a finite number >= 0")
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        raise ValueError(f"--gpu-memory-utilization {args.gpu_memory_utilization}: allowed a fraction above 0 and at "
                         "most 1")
    if args.time_limit is not None and not args.time_limit > 0:
        raise ValueError(f"--time-limit {args.time_limit}: allowed a positive number of seconds")
    for folder in (Path(args.out), *Path(args.out).parents):
        if folder.is_file():
            raise ValueError(f"--out {args.out}: {folder} is a file, so the results could not be written there "
                             "after the run; give a folder")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``das-trl bench live``; returns 0 when every check passed, 1 otherwise.

    Raises:
        ValueError: bad arguments (:func:`check_args`), an unknown drafter or an unusable history file.
    """
    args = parse_args(argv)
    check_args(args)
    cfg = LiveConfig(
        model=args.model, drafters=tuple(x.strip() for x in args.drafters.split(",") if x.strip()), task=args.task,
        prompts=args.prompts, samples=args.samples, max_tokens=args.max_tokens, temperature=args.temperature,
        greedy=args.greedy, history=args.history, warm_epochs=args.warm_epochs,
        num_speculative_tokens=args.num_speculative_tokens,
        das_config=json_overrides(args.das_config, "--das-config", DrafterConfig) if args.das_config else None,
        seed=args.seed, dtype=args.dtype, max_model_len=args.max_model_len, kv_cache_bytes=args.kv_cache_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.max_num_seqs,
        time_limit_s=args.time_limit, enforce_eager={"auto": None, "yes": True, "no": False}[args.enforce_eager],
    )
    result = run_live(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reports = [DrafterReport(**r) for r in result["results"]]
    table = format_table(reports, cpu=result["platform"] == "cpu")
    (out / "live.json").write_text(json.dumps(result, indent=1))
    (out / "table.txt").write_text(table + "\n")
    if reports:
        write_plot(reports, out / "live.png")
    print(table)
    print(f"history: {result['history']}")
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    for r in reports:
        for note in r.notes:
            print(f"note: {note}")
    for e in result["errors"]:
        print(f"ERROR: {e}", file=sys.stderr)
    print(f"wrote {out / 'live.json'}, {out / 'table.txt'}" + (f", {out / 'live.png'}" if reports else ""))
    return 0 if result["ok"] else 1
