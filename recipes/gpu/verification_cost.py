"""Time and peak memory of vLLM's verification logprobs: per verified position (patched) vs batch x longest (padded).

    python recipes/gpu/verification_cost.py --json verification-cost.json            # the full grid, CUDA if present
    python recipes/gpu/verification_cost.py --batch 4,8 --longest 1,4 --vocab 256    # toy size, any CPU

What it runs
------------
vLLM's ``RejectionSampler._get_logprobs_tensors`` (``vllm/v1/sample/rejection_sampler.py``, the same source in 0.32
and 0.33.0) re-written in plain torch, so it runs wherever torch runs (the GPU machine this was written for cannot
install vLLM). Per verification step of ``B`` rows, one drafting ``--longest`` tokens and the others
``min(--short, longest)`` each (DAS's plan: a few tail rows draft long, the rest short), with ``P = sum(draft + 1)``
verified positions:

* both shapes: ``final_logits``, ``[P, vocab]`` float32, filled from the draft and bonus positions' logits (vLLM has
  cast them to float32 before this function, whatever the model's dtype: ``--dtype`` sets the dtype of the model's
  ``logits``, whose shape alone the function reads);
* ``padded`` (vLLM's own): gathers ``B x (longest + 1)`` rows of it (each row's draft + 1 and the padding after
  it), log-softmaxes them in float32, gathers each row's sampled token and its rank (and the top
  ``--num-logprobs``);
* ``patched`` (das-trl's ``das_trl.vllm.verification_logprobs``): the same on the ``P`` verified rows, then spreads
  the small ``[P, num_logprobs + 1]`` results into the padded layout ``parse_output`` reads.

vLLM counts ranks with a compiled kernel (``batched_count_greater_than``); here it runs eagerly unless
``--compile`` (what vLLM runs): eager builds the comparison's ``[rows, vocab]`` bool and its sum's ``int64`` copy,
so on an H200 it took about twice the compiled run's peak memory and time at large sizes (1.91 vs 0.98 us per row).

What it prints
--------------
A table per point (B, longest, dtype, shape: rows log-softmaxed, median ms, peak MiB above the inputs) and a JSON
(``--json``) with every point and the least-squares fit ``ms = a + c_logprob_ms * rows`` over all points of the
first ``--dtype`` (rows = ``P`` patched, ``B x (longest + 1)`` padded), which is the figure das-trl's cost model
takes (``cost_model.c_logprob_ms``: milliseconds per row of the logprob path at this vocabulary; the JSON also gives
it per 1k vocabulary entries, to scale to another model). Timing: ``torch.cuda.Event`` on CUDA, ``perf_counter``
elsewhere; peak memory: ``torch.cuda.max_memory_allocated`` (CUDA only; ``null`` elsewhere). Points whose tensors
would not fit (``--max-gib``, default 90 % of the free GPU memory, 2 GiB on CPU) are listed as skipped.

torch and the standard library only: copy this file alone to a machine with torch and a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

SCHEMA = "das-trl/verification-cost/1"
GIB = 2**30
MIB = 2**20
SHAPES = ("patched", "padded")
MIN_R2 = 0.8  # a fit explaining less of the variance is not handed to the cost model


def parse_ints(text: str, name: str, low: int) -> list[int]:
    """``"64,128"`` -> ``[64, 128]``; each >= ``low``.

    Raises:
        SystemExit: a value that is not an integer or is below ``low`` (argparse's usage error).
    """
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--{name}: comma-separated integers, got {text!r}") from None
    if not values or min(values) < low:
        raise argparse.ArgumentTypeError(f"--{name}: integers >= {low}, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", default="64,128,256,512,1024", type=lambda t: parse_ints(t, "batch", 1),
                   help="rows per verification step (B), comma-separated")
    p.add_argument("--longest", default="1,4,16,32,64", type=lambda t: parse_ints(t, "longest", 1),
                   help="the longest draft of the step (tokens), comma-separated")
    p.add_argument("--short", type=int, default=2, help="draft tokens of every other row (capped at the longest)")
    p.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (default Qwen2's 151,936)")
    p.add_argument("--dtype", default="bfloat16,float32",
                   help="dtypes of the model's logits, comma-separated (the fit uses the first)")
    p.add_argument("--num-logprobs", type=int, default=0, help="top logprobs per position (TRL asks 0)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per point (the median is kept)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-gib", type=float, default=None,
                   help="skip points whose tensors need more (default: 90 %% of free GPU memory; 2 on CPU)")
    p.add_argument("--compile", action="store_true", help="count ranks with torch.compile, as vLLM does")
    p.add_argument("--json", default=None, help="write the points and the fit to this file")
    args = p.parse_args(argv)
    if args.short < 0 or args.vocab < 2 or args.num_logprobs < 0 or args.repeats < 1 or args.warmup < 0:
        p.error(f"need --short >= 0, --vocab >= 2, --num-logprobs >= 0, --repeats >= 1, --warmup >= 0; got "
                f"{args.short}, {args.vocab}, {args.num_logprobs}, {args.repeats}, {args.warmup}")
    try:
        args.dtypes = [getattr(torch, d.strip()) for d in args.dtype.split(",") if d.strip()]
    except AttributeError as e:
        p.error(f"--dtype: torch dtypes such as bfloat16,float32; {e}")
    return args


# ------------------------------------------------------------------------------------------------ the step


def step_layout(batch: int, longest: int, short: int) -> list[int]:
    """Draft tokens per row: row 0 drafts ``longest``, every other row ``min(short, longest)``."""
    return [longest] + [min(short, longest)] * (batch - 1)


def padded_rows(drafts: Sequence[int]) -> int:
    """Rows vLLM's own logprob path log-softmaxes: ``B x (longest + 1)``."""
    return len(drafts) * (max(drafts) + 1)


def verified_positions(drafts: Sequence[int]) -> int:
    """Rows the patched path log-softmaxes: ``sum(draft + 1)``."""
    return sum(d + 1 for d in drafts)


def step_inputs(drafts: Sequence[int], vocab: int, dtype: torch.dtype, device: str, seed: int = 0) -> dict[str, Any]:
    """The tensors ``_get_logprobs_tensors`` gets after a verification of ``drafts``, laid out as vLLM's model
    runner lays them out (each row's draft positions, then its bonus position):

    ``logits [P, vocab]`` (``dtype``), ``target_logits [sum(drafts), vocab]`` and ``bonus_logits [B, vocab]``
    (float32), ``target_index`` / ``bonus_index`` (int64, rows of ``logits``), ``cu_num_sampled_tokens`` (int64
    [B], inclusive), ``sampled_token_ids`` (int32 ``[B, longest + 1]``: the last draft token of each row rejected,
    -1 after it).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    target, bonus, start = [], [], 0
    for n in drafts:
        target.extend(range(start, start + n))
        bonus.append(start + n)
        start += n + 1
    width = max(drafts) + 1
    sampled = torch.full((len(drafts), width), -1, dtype=torch.int32)
    for i, n in enumerate(drafts):
        kept = max(n - 1, 0) + 1  # accepted tokens + the recovered one
        sampled[i, :kept] = torch.randint(0, vocab, (kept,), generator=gen, dtype=torch.int32)
    logits = torch.empty(start, vocab, dtype=dtype, device=device)
    target_logits = torch.randn(len(target), vocab, generator=gen).to(device)
    bonus_logits = torch.randn(len(drafts), vocab, generator=gen).to(device)
    as_index = lambda v: torch.tensor(v, dtype=torch.int64, device=device)  # noqa: E731
    return dict(logits=logits, target_logits=target_logits, bonus_logits=bonus_logits,
                target_index=as_index(target), bonus_index=as_index(bonus),
                cu_num_sampled_tokens=as_index([d + 1 for d in drafts]).cumsum(0),
                sampled_token_ids=sampled.to(device))


def _count_greater_eager(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return (x >= values).sum(-1)  # vllm.v1.sample.ops.logprobs.batched_count_greater_than


def _final_logits(inputs: dict[str, Any]) -> torch.Tensor:
    final = torch.zeros_like(inputs["logits"], dtype=torch.float32)
    final[inputs["target_index"]] = inputs["target_logits"]
    final[inputs["bonus_index"]] = inputs["bonus_logits"]
    return final


def _gather(logprobs: torch.Tensor, num_logprobs: int, tokens: torch.Tensor,
            count_greater: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``Sampler.gather_logprobs``: top-k ids and values with the sampled token's first, and its rank."""
    top_values, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
    tokens = tokens.unsqueeze(-1)
    token_logprobs = logprobs.gather(-1, tokens)
    ranks = count_greater(logprobs, token_logprobs)
    return torch.cat((tokens, top_ids), dim=1).to(torch.int32), torch.cat((token_logprobs, top_values), dim=1), ranks


def padded_logprobs(inputs: dict[str, Any], num_logprobs: int,
                    count_greater: Callable = _count_greater_eager) -> tuple[torch.Tensor, ...]:
    """vLLM 0.32 / 0.33.0's ``_get_logprobs_tensors``: ``B x (longest + 1)`` rows log-softmaxed."""
    final = _final_logits(inputs)
    sampled = inputs["sampled_token_ids"]
    cu = inputs["cu_num_sampled_tokens"]
    starts = torch.cat((cu.new_zeros(1), cu[:-1]))
    offsets = torch.arange(sampled.shape[-1], device=sampled.device)
    index = (starts.unsqueeze(1) + offsets.unsqueeze(0)).flatten().clamp_(max=final.shape[0] - 1)
    tokens = sampled.flatten().to(torch.int64)
    tokens[tokens == -1] = 0
    rows = final[index]
    return _gather(rows.log_softmax(dim=-1, dtype=torch.float32), num_logprobs, tokens, count_greater)


def patched_logprobs(inputs: dict[str, Any], num_logprobs: int,
                     count_greater: Callable = _count_greater_eager) -> tuple[torch.Tensor, ...]:
    """das-trl's ``logprobs_at_verified_positions``: the ``P`` verified rows log-softmaxed, results spread into the
    padded layout."""
    final = _final_logits(inputs)
    sampled = inputs["sampled_token_ids"]
    num_rows, width = sampled.shape
    cu = inputs["cu_num_sampled_tokens"]
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    owner = torch.repeat_interleave(torch.arange(num_rows, device=cu.device), counts, output_size=final.shape[0])
    where = owner * width + torch.arange(final.shape[0], device=cu.device) - (cu - counts)[owner]
    tokens = sampled.flatten()[where].to(torch.int64)
    tokens = tokens.masked_fill(tokens == -1, 0)
    compact = _gather(final.log_softmax(dim=-1, dtype=torch.float32), num_logprobs, tokens, count_greater)
    spread = []
    for t in compact:
        out = t.new_zeros((num_rows * width, *t.shape[1:]))
        spread.append(out.index_copy_(0, where, t))
    return tuple(spread)


PATHS: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {"patched": patched_logprobs, "padded": padded_logprobs}


# ------------------------------------------------------------------------------------------------ measuring


def bytes_needed(drafts: Sequence[int], vocab: int, shape: str, compiled: bool = False) -> int:
    """Upper estimate of the tensors one point holds at once: inputs (``2 P`` float32 rows), ``final_logits``
    (``P``), and rows of temporaries (``R = P`` patched): the gathered rows and their log-softmax, and eager the rank
    count's bool temporary and its sum's int64 copy: ``4.5 R`` eager, ``2.5 R`` compiled (an H200 measured 4.25-4.35
    and 2.0-2.1 ``R`` float32 rows above the inputs at every point of the default grid)."""
    p = verified_positions(drafts)
    r = p if shape == "patched" else padded_rows(drafts)
    return int((3 * p + (2.5 if compiled else 4.5) * r) * vocab * 4)


def time_call(fn: Callable[[], Any], repeats: int, warmup: int, cuda: bool) -> tuple[float, int | None]:
    """``(median ms, peak bytes allocated above the level at entry or None off CUDA)`` of ``fn()``."""
    for _ in range(warmup):
        fn()
    times = []
    peak = None
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        peak = torch.cuda.max_memory_allocated() - base
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(1000.0 * (time.perf_counter() - t0))
    return statistics.median(times), peak


def measure(args: argparse.Namespace, device: str) -> list[dict[str, Any]]:
    """Every (dtype, B, longest, shape) point: ``{"dtype", "batch", "longest", "short", "shape", "positions",
    "rows", "ms", "peak_mib"}``, or ``"skipped"`` (the bytes it would need) where it does not fit."""
    cuda = device.startswith("cuda")
    if args.max_gib is not None:
        limit = args.max_gib * GIB
    else:
        limit = 0.9 * torch.cuda.mem_get_info()[0] if cuda else 2 * GIB
    count_greater = torch.compile(_count_greater_eager, dynamic=True) if args.compile else _count_greater_eager
    points = []
    for dtype in args.dtypes:
        for batch in args.batch:
            for longest in args.longest:
                drafts = step_layout(batch, longest, args.short)
                inputs = None
                for shape in SHAPES:
                    point = dict(dtype=str(dtype).removeprefix("torch."), batch=batch, longest=longest,
                                 short=min(args.short, longest), shape=shape,
                                 positions=verified_positions(drafts),
                                 rows=verified_positions(drafts) if shape == "patched" else padded_rows(drafts))
                    need = bytes_needed(drafts, args.vocab, shape, args.compile)
                    if need > limit:
                        point.update(ms=None, peak_mib=None, skipped=f"needs ~{need / GIB:.1f} GiB")
                    else:
                        if inputs is None:
                            inputs = step_inputs(drafts, args.vocab, dtype, device)
                        fn = PATHS[shape]
                        try:
                            ms, peak = time_call(lambda: fn(inputs, args.num_logprobs, count_greater),
                                                 args.repeats, args.warmup, cuda)
                            point.update(ms=ms, peak_mib=None if peak is None else peak / MIB)
                        except torch.OutOfMemoryError:  # the estimate fell short: the point is the finding
                            point.update(ms=None, peak_mib=None, skipped=f"out of memory (estimated {need / GIB:.1f}"
                                                                         " GiB)")
                            if cuda:
                                torch.cuda.empty_cache()
                    points.append(point)
                    print(row_text(point), flush=True)
                del inputs
                if cuda:
                    torch.cuda.empty_cache()
    return points


def fit(points: Sequence[dict[str, Any]], vocab: int) -> dict[str, Any]:
    """Least squares ``ms = a + c_logprob_ms * rows`` over the measured ``points`` (both shapes).

    Returns:
        ``{"points", "a_ms", "c_logprob_ms", "c_logprob_ms_per_1k_vocab", "r2"}`` (``None`` values with fewer than
        two distinct row counts).
    """
    xs = [float(p["rows"]) for p in points if p["ms"] is not None]
    ys = [float(p["ms"]) for p in points if p["ms"] is not None]
    out: dict[str, Any] = {"points": len(xs), "a_ms": None, "c_logprob_ms": None, "c_logprob_ms_per_1k_vocab": None,
                           "r2": None}
    if len(set(xs)) < 2:
        return out
    xm, ym = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - xm) ** 2 for x in xs)
    slope = sum((x - xm) * (y - ym) for x, y in zip(xs, ys)) / sxx
    base = ym - slope * xm
    syy = sum((y - ym) ** 2 for y in ys)
    resid = sum((y - base - slope * x) ** 2 for x, y in zip(xs, ys))
    out.update(a_ms=base, c_logprob_ms=slope, c_logprob_ms_per_1k_vocab=slope * 1000.0 / vocab,
               r2=1.0 - resid / syy if syy > 0 else 0.0)
    return out


def row_text(p: dict[str, Any]) -> str:
    ms = "skipped" if p["ms"] is None else f"{p['ms']:.3f}"
    peak = "-" if p.get("peak_mib") is None else f"{p['peak_mib']:.0f}"
    note = f"  ({p['skipped']})" if p.get("skipped") else ""
    return (f"{p['dtype']:<9} {p['batch']:>5} {p['longest']:>7} {p['shape']:<8} {p['positions']:>9} {p['rows']:>8} "
            f"{ms:>10} {peak:>9}{note}")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else (platform.processor() or "cpu")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"{device_name(device)}: vocab {args.vocab:,}, other rows draft {args.short}, logprobs {args.num_logprobs}, "
          f"median of {args.repeats}")
    print(f"{'dtype':<9} {'B':>5} {'longest':>7} {'shape':<8} {'positions':>9} {'rows':>8} {'ms':>10} {'peak MiB':>9}")
    points = measure(args, device)
    first = str(args.dtypes[0]).removeprefix("torch.")
    fitted = fit([p for p in points if p["dtype"] == first], args.vocab)
    usable = fitted["c_logprob_ms"] is not None and fitted["c_logprob_ms"] > 0 and fitted["r2"] >= MIN_R2
    result = {"schema": SCHEMA, "device": device_name(device), "torch": torch.__version__, "vocab": args.vocab,
              "num_logprobs": args.num_logprobs, "compiled_rank_count": args.compile, "points": points,
              "fit": fitted, "cost_model": {"c_logprob_ms": fitted["c_logprob_ms"] if usable else None,
                                            "vocab": args.vocab}}
    if fitted["c_logprob_ms"] is None:
        print("fit: fewer than two distinct row counts measured")
    else:
        print(f"fit ({first}, {fitted['points']} points): ms = {fitted['a_ms']:.4f} + {fitted['c_logprob_ms']:.3e} "
              f"x rows (r2 {fitted['r2']:.3f}); per 1k vocab {fitted['c_logprob_ms_per_1k_vocab']:.3e} ms per row")
    if usable:
        print(f'cost model: das_budget_controller=\'{{"c_logprob_ms": {fitted["c_logprob_ms"]:.3g}}}\'')
    else:
        print(f"cost model: no figure (a fit needs a slope > 0 and r2 >= {MIN_R2}: a device shared with other work, "
              f"or too few rows to time; more --repeats or larger --batch / --longest)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
