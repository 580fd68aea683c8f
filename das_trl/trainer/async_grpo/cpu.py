"""What TRL 1.16's ``AsyncGRPOTrainer`` needs to train on a CPU-only torch (CI, a laptop); nothing here runs on GPUs.

Two places in TRL stop it on CPU:

- ``trl/trainer/utils.py:1824`` (``get_peak_flops_per_device``, called from ``async_grpo_trainer.py:1240`` in the
  trainer's ``__init__``) calls ``torch.cuda.get_device_name``, which raises ``AssertionError: Torch not compiled with
  CUDA enabled``. :func:`cpu_peak_flops_guard` answers ``None`` (MFU metrics off, as TRL does for unknown devices) for a
  non-CUDA device while the trainer is built.
- ``trl/experimental/async_grpo/packing.py:159-165``: the training forward's tree attention (``attn_implementation=
  "tree_fa3"``) calls FlashAttention-3 fetched from the Hugging Face Hub by the ``kernels`` package (CUDA/ROCm only).
  :func:`tree_attention_torch` computes the same attention in plain torch; :func:`register_cpu_tree_attention`
  registers it under TRL's name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

TREE_ATTENTION = "tree_fa3"  # trl/experimental/async_grpo/packing.py: TREE_ATTENTION


def tree_attention_torch(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: Any, *, tree_kv_index: torch.Tensor, tree_cu_seqlens_q: torch.Tensor,
                         tree_cu_seqlens_k: torch.Tensor, tree_max_seqlen_q: int, tree_max_seqlen_k: int,
                         scaling: float | None = None, sliding_window: int | None = None,
                         softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """TRL's ``tree_attention`` (``packing.py``) in plain torch: each segment of a packed prefix trie attends causally
    to the K/V rows of its root-to-segment path.

    Args:
        query: ``[1, H, N, D]`` (N packed tokens); key, value: ``[1, H_kv, N, D]`` (``H`` a multiple of ``H_kv``).
        tree_kv_index: int64 ``[M]``, the packed positions of every segment's path, paths laid end to end.
        tree_cu_seqlens_q: int32 ``[S + 1]``, segment boundaries in the packed row.
        tree_cu_seqlens_k: int32 ``[S + 1]``, path boundaries in ``tree_kv_index``; a segment's own tokens are the
            last ones of its path (the causal mask is aligned bottom-right, as FlashAttention's).
        scaling: softmax scale (default ``D ** -0.5``); sliding_window, softcap: as in FlashAttention.
        tree_max_seqlen_q, tree_max_seqlen_k, attention_mask, module: accepted for the interface, not needed.

    Returns:
        ``(output [1, N, H, D], None)`` in the query's dtype.

    Cost: one ``[H, q, k]`` score matrix per segment (segments run one after another); meant for small CPU runs.
    """
    q, k, v = query[0], key[0].index_select(1, tree_kv_index), value[0].index_select(1, tree_kv_index)
    heads, kv_heads = q.shape[0], k.shape[0]
    if heads != kv_heads:  # grouped-query attention: each K/V head serves heads // kv_heads query heads
        k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    out = torch.empty(q.shape[1], heads, q.shape[2], dtype=q.dtype, device=q.device)
    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        scores = torch.matmul(q[:, q0:q1].float(), k[:, k0:k1].float().transpose(1, 2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        rows = torch.arange(q1 - q0, device=q.device)[:, None] + (k1 - k0) - (q1 - q0)  # key position of each query
        cols = torch.arange(k1 - k0, device=q.device)[None, :]
        hidden = cols > rows
        if sliding_window:
            hidden |= cols <= rows - sliding_window
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out[q0:q1] = torch.matmul(probs, v[:, k0:k1].float()).transpose(0, 1).to(q.dtype)
    return out.unsqueeze(0), None


def register_cpu_tree_attention() -> None:
    """Register :func:`tree_attention_torch` as transformers' ``"tree_fa3"`` attention (replacing TRL's
    FlashAttention-3 one for every model in this process that uses the name)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(TREE_ATTENTION, tree_attention_torch)
    AttentionMaskInterface.register(TREE_ATTENTION, lambda **kwargs: None)  # the trie's paths are the mask


@contextlib.contextmanager
def cpu_peak_flops_guard() -> Iterator[None]:
    """While active, ``AsyncGRPOTrainer.__init__``'s peak-FLOPs lookup answers ``None`` for a non-CUDA device instead
    of raising (``trl/trainer/utils.py:1824``); CUDA devices get TRL's own lookup."""
    from trl.experimental.async_grpo import async_grpo_trainer

    original = async_grpo_trainer.get_peak_flops_per_device

    def peak_flops(accelerator: Any, dtype: str) -> float | None:
        return original(accelerator, dtype) if accelerator.device.type == "cuda" else None

    async_grpo_trainer.get_peak_flops_per_device = peak_flops
    try:
        yield
    finally:
        async_grpo_trainer.get_peak_flops_per_device = original
