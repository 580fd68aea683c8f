"""Measure the forward-pass cost model ``t(T) = c_base + c_tok * T`` on this device, with the model at hand.

A decode/verification step runs ``B`` requests with ``q`` new tokens each (1 sampled + ``q - 1`` draft tokens) over
their KV caches: ``T = B * q`` tokens in the pass. This bench times exactly that at the torch level (transformers,
``past_key_values``, the cache cropped back after every pass so the context length stays ``--context``) over a grid
of ``B`` and ``q``, fits ``c_base`` and ``c_tok`` by least squares, and prints the ``das_budget_controller`` values
to use. It measures the device it runs on: on a CPU it measures the CPU (right for the CPU engine, which is
compute-bound, so ``c_tok`` is large), on a GPU the GPU. It does not run vLLM's kernels, CUDA graphs or scheduler,
so a live engine's step times differ; the proposer's online fit (``cost_source="online"``) measures those.

A pass's time does not depend on the weights' values, so ``--random-init`` profiles a model from its config alone
(``--model`` is then a directory or hub name holding ``config.json``; the weights are random, built on the device):
a 7B model's profile needs no download of its 15 GB of weights, e.g. on a GPU machine without network.

CLI::

    das-trl bench cost-profile [--model PATH] [--random-init] [--batch 1,4,16,64] [--query 1,4,8,16]
        [--context 256] [--repeats 5] [--device cpu|cuda] [--dtype float32] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Sequence

from das_trl.bench.options import output_file, positive_int, positive_int_list
from das_trl.budget.cost_model import fit_linear

#: The ``--dtype`` names (torch attribute names).
DTYPES = ("float32", "bfloat16", "float16")


def model_arg(text: str) -> str:
    """argparse ``type=`` of ``--model``: a hub name (``ORG/NAME``, passed on as-is: transformers downloads it) or a
    local path, which must exist and, when a folder, hold ``config.json`` (``~`` expanded).

    Raises:
        argparse.ArgumentTypeError: a local-looking path (:func:`das_trl.vllm.serve.looks_local`) that does not
            exist, or a folder without ``config.json``.
    """
    from das_trl.vllm.serve import looks_local  # imports torch, not vLLM

    path = os.path.expanduser(text)
    if not (looks_local(text) or os.path.exists(path)):
        return text  # a hub name
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"local path {text!r} does not exist (give a model folder or a hub name "
                                         "such as Qwen/Qwen2.5-0.5B)")
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        raise argparse.ArgumentTypeError(f"folder {text!r} holds no config.json (not a Hugging Face model folder)")
    return path


def device_arg(text: str) -> str:
    """argparse ``type=`` of ``--device``: ``cpu``, ``cuda`` or ``cuda:N`` (the passes are timed with CUDA's
    synchronisation only), CUDA only where torch sees it.

    Raises:
        argparse.ArgumentTypeError: not a torch device string, another device type, or CUDA (or that CUDA device)
            unavailable.
    """
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N (the bench times CPU and CUDA passes only), "
                                         f"got {text!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine (torch "
                                             f"{torch.__version__}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r}: no such CUDA device ({torch.cuda.device_count()} visible)")
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="das-trl bench cost-profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=model_arg, default=None,
                   help="model path or hub name (default: the embedded SmolLM2-135M)")
    p.add_argument("--random-init", action="store_true",
                   help="build the model from --model's config.json with random weights (no weights needed)")
    p.add_argument("--batch", type=positive_int_list, default="1,4,16,64",
                   help="comma-separated requests per pass (B)")
    p.add_argument("--query", type=positive_int_list, default="1,4,8,16",
                   help="comma-separated tokens per request per pass (q = 1 + draft)")
    p.add_argument("--context", type=positive_int, default=256,
                   help="KV-cache length per request before the pass (tokens, >= 1)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed passes per grid point (the median is kept)")
    p.add_argument("--device", type=device_arg, default=None,
                   help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="float32 / bfloat16 / float16 (default: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--json", type=output_file, default=None,
                   help="write the measurements and the fit to this JSON file")
    return p.parse_args(argv)


def measure(model, batch_sizes: Sequence[int], queries: Sequence[int], context: int, repeats: int,
            device: str) -> list[dict]:
    """Median time (ms) of one pass per ``(B, q)``: ``[{"batch", "query", "tokens", "ms"}]``."""
    import torch
    from transformers import DynamicCache

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for b in batch_sizes:
        ctx = torch.randint(0, vocab, (b, context), generator=gen).to(device)
        with torch.inference_mode():
            cache = DynamicCache()
            try:  # the prefill's logits for its last position only: all of them are B x context x vocab (80 GB
                # at 256 x 1k for a 152k vocabulary), which an engine never builds
                model(input_ids=ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
            except TypeError:  # a model class without the argument
                cache = DynamicCache()
                model(input_ids=ctx, past_key_values=cache, use_cache=True)
            for q in queries:
                new = torch.randint(0, vocab, (b, q), generator=gen).to(device)
                pos = torch.arange(context, context + q, device=device).expand(b, q)
                times = []
                for rep in range(repeats + 1):  # the first pass warms up
                    sync()
                    t0 = time.perf_counter()
                    model(input_ids=new, past_key_values=cache, position_ids=pos, use_cache=True)
                    sync()
                    if rep:
                        times.append(1000.0 * (time.perf_counter() - t0))
                    cache.crop(-q)  # back to `context` tokens
                rows.append({"batch": b, "query": q, "tokens": b * q, "ms": statistics.median(times)})
                print(f"  B={b:>4} q={q:>3} tokens={b * q:>6}  {rows[-1]['ms']:8.2f} ms", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("float32" if torch.device(device).type == "cpu" else "bfloat16"))
    model_path = args.model
    if model_path is None:
        from das_trl.defaults.model import prepare_default_model
        model_path = prepare_default_model()
    if args.random_init:
        from transformers import AutoConfig

        with torch.device(device):  # initialised where it runs: a 7B model's random weights in seconds on a GPU
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path), dtype=dtype).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    params = sum(p.numel() for p in model.parameters())
    batches, queries = args.batch, args.query
    print(f"cost profile of {model_path} ({params / 1e9:.2f}B parameters{', random weights' if args.random_init else ''})"
          f" on {device} ({dtype}), context {args.context} tokens, threads {torch.get_num_threads()}")
    rows = measure(model, batches, queries, args.context, args.repeats, device)
    base, tok, r2 = fit_linear([r["tokens"] for r in rows], [r["ms"] for r in rows])
    print(f"fit: t(T) = {base:.3f} ms + {tok:.5f} ms/token * T   (r2 {r2:.3f}; {len(rows)} points)")
    print(f"use: das_budget_controller={{\"c_base_ms\": {max(base, 1e-3):.3f}, \"c_tok_ms\": {max(tok, 1e-6):.5f}, "
          f"\"cost_source\": \"config\"}}")
    if base <= 0 or tok <= 0:
        print("warning: a fitted coefficient is <= 0 (noise, or a flat regime): measure a wider --batch/--query grid")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": str(model_path), "random_init": bool(args.random_init),
                                               "parameters": params, "device": device,
                                               "device_name": torch.cuda.get_device_name() if device.startswith(
                                                   "cuda") else None, "dtype": str(dtype),
                                               "context": args.context, "points": rows, "c_base_ms": base,
                                               "c_tok_ms": tok, "r2": r2}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
