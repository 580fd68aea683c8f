"""Record frozen-policy rollouts for the replay benchmark: N epochs of the same problems from a vLLM engine.

No drafter is involved: each epoch samples ``--samples`` completions of every problem at ``--temperature`` with a
different seed, and all of them are appended to ``--out`` in the JSONL format of
:mod:`das_trl.drafter.rollout_log` (``step`` = ``epoch`` = the epoch index). Replay them with
``python -m das_trl.bench.replay --rollouts FILE``.

Example (CPU, about 3-6 minutes on 2 cores)::

    python -m das_trl.bench.micro.record --problems 32 --samples 8 --epochs 4 --temperature 0.6 \
        --max-tokens 256 --out runs/replay/t06.jsonl
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from das_trl.bench.live.config import VLLM_DTYPES, engine_seed
from das_trl.bench.options import non_negative_float, output_file, positive_int
from das_trl.drafter.rollout_log import RolloutRecord, append_records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das-trl bench record", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model path (default: das_trl.defaults.model.prepare_default_model())")
    p.add_argument("--task", default="gsm_symbolic", help="reasoning-gym task (default: %(default)s)")
    p.add_argument("--problems", type=positive_int, default=32, help="problems per epoch (default: %(default)s)")
    p.add_argument("--samples", type=positive_int, default=8,
                   help="completions per problem per epoch (default: %(default)s)")
    p.add_argument("--epochs", type=positive_int, default=4, help="(default: %(default)s)")
    p.add_argument("--temperature", type=non_negative_float, default=0.6, help="(default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="(default: %(default)s)")
    p.add_argument("--seed", type=engine_seed, default=0,
                   help="dataset and engine seed, 0 to 2**32 - 1 (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=VLLM_DTYPES, help="vLLM's dtype (default: %(default)s)")
    p.add_argument("--kv-cache-bytes", type=positive_int, default=1 << 30, help="(default: %(default)s)")
    p.add_argument("--max-model-len", type=positive_int, default=1024, help="(default: %(default)s)")
    p.add_argument("--out", type=output_file, required=True,
                   help="JSONL file (appended to; refuses an existing one unless --force)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    args = p.parse_args(argv)
    if Path(args.out).exists() and not args.force:
        p.error(f"argument --out: {args.out} exists (--force overwrites it)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists():  # --force
        out.unlink()
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from das_trl.defaults.data import load_reasoning_gym_dataset

    model = args.model
    if model is None:
        from das_trl.defaults.model import prepare_default_model
        model = prepare_default_model()
    tok = AutoTokenizer.from_pretrained(model)
    ds = load_reasoning_gym_dataset(args.task, size=args.problems, seed=args.seed)
    prompts = [list(tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                            return_dict=False)) for row in ds]
    llm = LLM(model=model, dtype=args.dtype, enforce_eager=True, kv_cache_memory_bytes=args.kv_cache_bytes,
              max_model_len=args.max_model_len, max_num_seqs=min(256, args.problems * args.samples),
              block_size=32, seed=args.seed)
    total = 0
    for epoch in range(args.epochs):
        t0 = time.time()
        # No per-request seed: the engine's seeded RNG stream continues across epochs and siblings, so every
        # completion is an independent sample (a per-request seed could make the n siblings identical).
        sp = SamplingParams(n=args.samples, temperature=args.temperature, max_tokens=args.max_tokens)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=True)
        records = []
        for prompt, res in zip(prompts, outs):
            for comp in res.outputs:
                records.append(RolloutRecord.make(epoch, float(epoch), prompt, list(comp.token_ids),
                                                  "length" if comp.finish_reason == "length" else "stop"))
        append_records(out, records)
        total += len(records)
        lens = [len(r.completion_ids) for r in records]
        print(f"epoch {epoch}: {len(records)} rollouts, mean length {sum(lens) / len(lens):.1f}, "
              f"max {max(lens)}, {time.time() - t0:.0f} s", flush=True)
    print(f"wrote {total} rollouts to {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
