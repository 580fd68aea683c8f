"""Memory of vLLM's verification logprob path, upstream and with das-trl's patch, by draft layout.

    python scripts/bench_verification_logprobs.py                        # B 64, vocab 151,936, logprobs 0
    python scripts/bench_verification_logprobs.py --batch 256 --num-logprobs 5 --repeats 3

Calls ``RejectionSampler._get_logprobs_tensors`` (vLLM's own function, then
:func:`das_trl.vllm.verification_logprobs.logprobs_at_verified_positions`) on CPU tensors laid out as the model runner
lays them out, for two drafts of the same size: ``one long`` (row 0 drafts ``--draft`` tokens, the other rows none)
and ``spread`` (``--draft`` rows draft one token each). Printed per function and layout: the peak growth of the
process's resident memory while the function runs (a thread samples ``/proc/self/statm``; tensors above glibc's
32 MiB mmap threshold go back to the system when freed) and the peak bytes of tensors the function holds at once
(:class:`TensorPeak`, exact), then the target: one long draft grows the process by at most 2x what the spread
layout does, + 64 MiB. Compiled helpers (``batched_count_greater_than``) are compiled once first, as in the engine.
"""

from __future__ import annotations

import argparse
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MIB = 2**20
SLACK_BYTES = 64 * MIB  # the target's "+64 MiB"


class TensorPeak(TorchDispatchMode):
    """The most bytes of tensor storage created inside the ``with`` block that were alive at once.

    Every aten op's output storage is counted once (views share it) from its creation until the last tensor on it
    is collected; storages of the tensors passed as ``existing`` (the inputs) are not counted. Exact and
    deterministic, unlike the process's resident memory; temporaries inside a single aten kernel are not seen.
    """

    def __init__(self, *existing: torch.Tensor) -> None:
        super().__init__()
        self._existing = {t.untyped_storage().data_ptr() for t in existing}
        self._live: dict[int, list[int]] = {}  # storage address -> [bytes, tensors on it]
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if not size or key in self._existing:
            return
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [size, 0]
            self.current += size
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.current -= entry[0]
                del self._live[key]


class RssPeak:
    """Peak growth of the process's resident memory above its level at entry (sampled every ``interval`` s)."""

    def __init__(self, interval: float = 0.0005) -> None:
        self.interval = interval
        self.peak = 0
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def __enter__(self) -> RssPeak:
        self._base = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self._base)
            time.sleep(self.interval)

    def __exit__(self, *exc: Any) -> None:
        self.peak = max(self.peak, self._rss() - self._base)
        self._stop.set()
        self._thread.join()


def layout(name: str, batch: int, draft: int) -> list[list[int]]:
    """Drafts per row: ``"one long"`` (row 0 drafts ``draft`` tokens) or ``"spread"`` (``draft`` rows, one each)."""
    if name == "one long":
        return [[1] * draft] + [[] for _ in range(batch - 1)]
    if name == "spread":
        return [[1] if i < draft else [] for i in range(batch)]
    raise ValueError(f"unknown layout {name!r}: 'one long' or 'spread'")


def verification_inputs(drafts: list[list[int]], vocab_size: int, seed: int = 0) -> dict[str, Any]:
    """The arguments ``_get_logprobs_tensors`` gets after a verification of ``drafts`` (all drafts accepted but the
    last token of each, so rejected positions are present): ``metadata``, ``logits`` ``[positions, vocab]`` float32,
    ``target_logits``, ``bonus_logits``, ``sampled_token_ids`` int32 ``[B, longest + 1]``."""
    from das_trl.vllm.verification_logprobs import make_metadata

    gen = torch.Generator().manual_seed(seed)
    metadata = make_metadata(drafts)
    logits = torch.randn(sum(len(d) + 1 for d in drafts), vocab_size, generator=gen)
    width = max(len(d) for d in drafts) + 1
    sampled = torch.full((len(drafts), width), -1, dtype=torch.int32)
    for i, d in enumerate(drafts):
        accepted = max(len(d) - 1, 0)  # the last draft token rejected: a recovered token there, -1 after it
        sampled[i, : accepted + 1] = torch.randint(0, vocab_size, (accepted + 1,), generator=gen, dtype=torch.int32)
    return dict(metadata=metadata, logits=logits, target_logits=logits[metadata.target_logits_indices.long()],
                bonus_logits=logits[metadata.bonus_logits_indices.long()], sampled_token_ids=sampled)


def rejection_sampler() -> Any:
    """vLLM's ``RejectionSampler`` with its default ``Sampler`` (processed logprobs as TRL asks), on CPU."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    return RejectionSampler(Sampler(logprobs_mode="processed_logprobs"))


def measure(fn: Callable[..., Any], owner: Any, inputs: dict[str, Any], num_logprobs: int) -> tuple[int, int]:
    """``(peak RSS growth, peak tensor bytes)`` of one call ``fn(owner, num_logprobs, **inputs)``."""
    existing = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    existing += [v for v in vars(inputs["metadata"]).values() if isinstance(v, torch.Tensor)]
    gc.collect()
    with RssPeak() as rss:
        out = fn(owner, num_logprobs, **inputs)
    del out
    gc.collect()
    with TensorPeak(*existing) as tensors:
        out = fn(owner, num_logprobs, **inputs)
    del out
    return rss.peak, tensors.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="rows in the batch (default 64)")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (default Qwen2's 151,936)")
    parser.add_argument("--draft", type=int, default=64, help="draft tokens in all, per layout (default 64)")
    parser.add_argument("--num-logprobs", type=int, default=0, help="top logprobs per position (TRL asks 0)")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per case; the largest is printed")
    args = parser.parse_args()
    if not 1 <= args.draft <= args.batch:
        parser.error(f"--draft must be in [1, --batch={args.batch}], got {args.draft}")

    from das_trl.vllm import verification_logprobs as patch

    sampler = rejection_sampler()
    upstream = patch._upstream()
    # compile vLLM's batched_count_greater_than once (dynamic batch), as the engine's first step does
    for fn in (upstream, patch.logprobs_at_verified_positions):
        fn(sampler, args.num_logprobs, **verification_inputs(layout("spread", 4, 2), 64))
    print(f"B {args.batch}, vocab {args.vocab:,}, {args.draft} draft tokens, logprobs {args.num_logprobs}; "
          f"peak growth during one call (MiB)")
    print(f"{'function':<10} {'layout':<9} {'positions':>9} {'padded rows':>11} {'RSS':>9} {'tensors':>9}")
    results: dict[tuple[str, str], tuple[int, int]] = {}
    for label, fn in (("upstream", upstream), ("patched", patch.logprobs_at_verified_positions)):
        for name in ("spread", "one long"):
            drafts = layout(name, args.batch, args.draft)
            inputs = verification_inputs(drafts, args.vocab)
            peaks = [measure(fn, sampler, inputs, args.num_logprobs) for _ in range(args.repeats)]
            rss, tensors = max(p[0] for p in peaks), max(p[1] for p in peaks)
            results[label, name] = (rss, tensors)
            del inputs
            print(f"{label:<10} {name:<9} {sum(len(d) + 1 for d in drafts):>9} "
                  f"{args.batch * (max(len(d) for d in drafts) + 1):>11} {rss / MIB:>9.1f} {tensors / MIB:>9.1f}")
    for label in ("upstream", "patched"):
        (rss_s, ten_s), (rss_l, ten_l) = results[label, "spread"], results[label, "one long"]
        bound = 2 * rss_s + SLACK_BYTES
        print(f"{label}: one long / spread = {rss_l / max(rss_s, 1):.2f}x RSS, {ten_l / max(ten_s, 1):.2f}x tensors; "
              f"target (one long <= 2 x spread + 64 MiB = {bound / MIB:.0f} MiB): "
              f"{'met' if rss_l <= bound else 'missed'} ({rss_l / MIB:.0f} MiB)")


if __name__ == "__main__":
    main()
