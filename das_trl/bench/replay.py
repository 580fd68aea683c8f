"""Replay benchmark: draft a recorded later epoch given the earlier ones, verification round by round.

Input: rollouts in the JSONL format of :mod:`das_trl.drafter.rollout_log` (the trainer's ``das_record_rollouts``
or :mod:`das_trl.bench.micro.record`). Epoch index = a problem's k-th appearance (``--group-by appearance``, default)
or ``floor(record.epoch)``; by default every epoch but the last is history and the last is replayed.

Simulation (hardware-independent; no model runs; :mod:`das_trl.bench.simulation`): the eval epoch's requests all
start together and run as a continuous batch. Each engine step, every running request gets a draft from the drafter
(budget: the drafter's own, the paper's :class:`~das_trl.budget.tiers.LengthPolicy`, or the batch budget
controller), the draft is accepted up to its first mismatch with the recorded completion, and the request emits
accepted + 1 tokens (never past its recorded end). Running siblings see each other's outputs as of the previous step
(the drafter's sibling visibility; arctic's active responses). A step costs ``t_fwd = c_base + c_tok *
tokens_in_pass + c_logprob * logprob rows`` (ms; tokens = running requests + their draft tokens; logprob rows: the
verified positions, or rows x (longest draft + 1) with ``--verification-shape padded``); the batch drains as requests
finish. ``--admission``: requests enter under the engine's token budget with their prompts' prefill
(:class:`~das_trl.bench.simulation.Admission`). Warm-up
(default; ``--no-warmup`` turns it off): each drafter first serves the last history epoch the same way, which then
becomes history, as in a live run; only the replayed epoch is measured.

Drafters: ``none``; ``ngram`` (vLLM's prompt lookup: longest suffix n-gram in [min, max] of prompt + output,
earliest occurrence, k tokens after it); ``suffix`` (vLLM 0.32's ``suffix`` method as shipped: arctic-inference
``SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)``, num_speculative_tokens 24,
max_spec_factor 1.0, min_token_prob 0.1; earlier epochs' responses are fed in as cached requests); DAS ablations
``das-problem`` (per-problem tree only), ``das+global`` (+ global and local trees), ``das+siblings`` (+ running
siblings), ``das+policy`` (+ length policy, tiers mode), ``das+cost`` (+ length policy, cost mode),
``das+controller`` (+ the batch budget controller); one file each in :mod:`das_trl.bench.drafters`.

Metrics per drafter: tokens per verification round (emitted tokens / request-rounds), verification (draft)
tokens per accepted draft token, forward passes per request (mean), tail forward passes (the most any request
needed = the step count of the batch), and the simulated rollout time (ms) (:mod:`das_trl.bench.report`).

This module is the command line; the data sets are :mod:`das_trl.bench.sets`.

CLI::

    python -m das_trl.bench.replay --rollouts FILE [--train-epochs 0,1,2] [--eval-epoch 3]
        [--drafters none,ngram,suffix,das+policy] [--json OUT] [--plots DIR]
        [--host-speed 1] [--draft-threads N] [--async-off-ms 0] [--c-logprob MS] [--verification-shape padded]
        [--admission trainer|TOKENS] [--max-num-seqs N] [--no-prefix-cache] [--verify-limit profile|TOKENS]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Sequence

from das_trl.budget import ControllerConfig
from das_trl.budget.tiers import LengthPolicyConfig
from das_trl.drafter import DrafterConfig

from das_trl.bench.drafters import ALL_DRAFTERS, DEFAULT_DRAFTERS, controller_config, draft_cap, make_drafter
from das_trl.bench.drafters.suffix import SUFFIX_DEFAULTS
from das_trl.bench.options import (add_cpu_args, add_engine_args, admission_for, drafter_names, epoch_list,
                                  json_overrides, limits_for, ngram_spec, output_dir, output_file, positive_float)
from das_trl.bench.report import format_table, format_tiers, write_plots, write_replay_json
from das_trl.bench.sets import load_epochs, split_epochs
from das_trl.bench.simulation import Bounds, simulate


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das-trl bench replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", required=True, help="JSONL rollouts (das_trl.drafter.rollout_log format)")
    p.add_argument("--train-epochs", type=epoch_list, default=None,
                   help="comma-separated history epochs, all before --eval-epoch (default: every epoch before it); "
                        "the eval epoch itself or a later one is refused: the replay drafts an epoch from the ones "
                        "before it, and a later epoch's rollouts would show the drafters the future")
    p.add_argument("--eval-epoch", type=int, default=None, help="epoch to replay (default: the last)")
    p.add_argument("--group-by", choices=("appearance", "epoch"), default="appearance",
                   help="how records are numbered into epochs: 'appearance' (default): the k-th training step in "
                        "which a problem appears is its epoch k (k = 0, 1, ...); 'epoch': the record's own epoch "
                        "field, rounded down")
    p.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS),
                   help=f"comma-separated from {','.join(ALL_DRAFTERS)}, each once (default: all; das+controller is "
                        "das-trl's default drafter)")
    p.add_argument("--c-base", type=positive_float, default=7.0,
                   help="cost model: ms per forward pass (default: %(default)s; `das-trl bench cost-profile` "
                        "measures it)")
    p.add_argument("--c-tok", type=positive_float, default=0.025,
                   help="cost model: ms per token in a pass (default: %(default)s)")
    p.add_argument("--ngram", type=ngram_spec, default=(5, 5, 8),
                   help="MIN,MAX,K for ngram: prompt_lookup_min, prompt_lookup_max (n-gram sizes, 1 <= MIN <= MAX) "
                        "and num_speculative_tokens (K >= 1); default 5,5,8")
    p.add_argument("--policy", default=None, help="JSON of LengthPolicyConfig overrides, e.g. '{\"short_budget\": 0}'")
    p.add_argument("--controller", default=None,
                   help="JSON of ControllerConfig overrides for das+controller (its cost model is --c-base/--c-tok)")
    p.add_argument("--das-config", default=None,
                   help="JSON of DrafterConfig overrides for every DAS variant, e.g. '{\"max_spec_factor\": 1.0}'")
    p.add_argument("--no-warmup", action="store_true",
                   help="load every history epoch directly, without first serving the last one (drafters then start "
                        "the replayed epoch with nothing learned from verification)")
    p.add_argument("--json", type=output_file, default=None, help="write results to this JSON file")
    p.add_argument("--plots", type=output_dir, default=None, help="write PNG plots into this directory")
    add_cpu_args(p)
    add_engine_args(p)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``das-trl bench replay``.

    Raises:
        FileNotFoundError: ``--rollouts`` does not exist.
        ValueError: bad input: no drafter, one listed twice or an unknown one
            (:func:`~das_trl.bench.options.drafter_names`), a JSON option that is not an object of the config's
            fields, an unusable rollouts file or record (:func:`~das_trl.bench.sets.load_epochs`), or epochs that
            cannot be split (:func:`~das_trl.bench.sets.split_epochs`).
    """
    args = parse_args(argv)
    # Options first (cheap), so a typo fails before a large file is read, not minutes into a replay.
    names = drafter_names(args.drafters, ALL_DRAFTERS)
    ngram = args.ngram
    pc = LengthPolicyConfig(**json_overrides(args.policy, "--policy", LengthPolicyConfig))
    das_ov = json_overrides(args.das_config, "--das-config", DrafterConfig)
    if das_ov:
        DrafterConfig(**das_ov)  # its values too, before any drafter runs
    if not Path(args.rollouts).exists():
        raise FileNotFoundError(f"--rollouts {args.rollouts}: no such file. Next step: record rollouts with the "
                                "trainer's das_record_rollouts (bash scripts/main_job.sh writes "
                                "runs/embedded-default/rollouts.jsonl), or replay a committed set: benchmarks/sets/")
    shape = args.verification_shape
    cc = controller_config(args.c_base, args.c_tok, json_overrides(args.controller, "--controller", ControllerConfig),
                           args.c_logprob, shape)
    epochs = load_epochs(args.rollouts, args.group_by)
    train, evals, tr, ev = split_epochs(epochs, args.train_epochs, args.eval_epoch)
    print(f"{args.rollouts}: history epochs {tr} ({sum(len(x) for x in train)} rollouts), replaying epoch {ev} "
          f"({len(evals)} rollouts, {len({r.problem_key for r in evals})} problems, "
          f"{sum(len(r.completion_ids) for r in evals)} tokens); cost model {args.c_base} ms + {args.c_tok} ms/token "
          f"+ {args.c_logprob} ms per logprob row ({shape})")
    admission = admission_for(args, len(evals))
    price = dict(c_logprob=args.c_logprob, verification_shape=shape)
    limits = limits_for(args, len(evals), shape)
    results = []
    for name in names:
        res = simulate(make_drafter(name, ngram, pc, das_ov, cc, args.draft_threads), train, evals, args.c_base,
                       args.c_tok, warmup=not args.no_warmup, admission=admission, limits=limits, **price)
        results.append(res)
    # oracle-trim cuts das+siblings' drafts: replayed for the bound when it is not among the drafters. The bounds
    # have no prefill: none with --admission.
    bounds = None
    if admission is None:
        sib = next((r for r in results if r.name == "das+siblings"), None)
        if sib is None:
            sib = simulate(make_drafter("das+siblings", ngram, pc, das_ov, cc, args.draft_threads), train, evals,
                           args.c_base, args.c_tok, warmup=not args.no_warmup, **price)
        # oracle-text at the drafters' cap K (--das-config's max_spec_tokens), as the suite's bounds
        bounds = Bounds.of(sib, [len(r.completion_ids) for r in evals], draft_cap(das_ov))
    print(format_table(results, args.c_base, args.c_tok, args.host_speed, args.async_off_ms, bounds, legend=True))
    print(format_tiers(results))
    if args.json:
        write_replay_json(args.json, {"rollouts": str(args.rollouts), "train_epochs": tr, "eval_epoch": ev,
                                      "c_base_ms": args.c_base, "c_tok_ms": args.c_tok, "ngram": list(ngram),
                                      "warmup": not args.no_warmup and len(train) >= 2, "policy": pc.to_dict(),
                                      "das_config_overrides": das_ov, "controller": cc.to_dict(),
                                      "suffix": SUFFIX_DEFAULTS, "draft_threads": args.draft_threads or 1,
                                      "c_logprob_ms": args.c_logprob, "verification_shape": shape,
                                      "admission": None if admission is None else dataclasses.asdict(admission),
                                      "verification_limits": None if limits is None else dataclasses.asdict(limits)},
                          results, args.c_base, args.c_tok, args.host_speed, args.async_off_ms, bounds)
        print(f"wrote {args.json}")
    if args.plots:
        hist_lengths = [len(r.completion_ids) for recs in train for r in recs]
        for f in write_plots(results, args.plots, hist_lengths):
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
