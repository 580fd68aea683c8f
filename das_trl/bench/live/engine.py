"""The live A/B's engines: one ``vllm.LLM`` per drafter, driven step by step, and vLLM's speculative-decoding
counters.

Each engine's core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so one ``step()`` is one
scheduler step = one forward pass; the batch is sent as TRL's colocate mode sends it (one request per (prompt,
sample), ``n=1``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from das_trl.bench.live.config import DRAFTERS, LiveConfig

#: Qualified name of the worker extension that gives vLLM's ``suffix`` engine the history (loaded by vLLM's workers).
SUFFIX_HISTORY_EXTENSION = "das_trl.bench.live.history.SuffixHistoryExtension"


@dataclass
class BatchResult:
    """One drafter's run of the batch, as the engine reported it.

    Attributes (per request, in submission order: prompt-major, sample-minor):
        tokens: completion token ids.
        logprobs: logprob of each sampled token (``float``, natural log) or ``None`` where vLLM returned none.
        rounds: verification rounds (engine steps in which the request emitted >= 1 token; the prefill step counts).
        finish_step: the 1-based engine step at which the request finished.
        engine_steps: scheduler steps until the whole batch finished (the makespan in forward passes).
        wall_seconds: seconds for the batch (CPU: not a speed claim).
    """

    tokens: list[list[int]]
    logprobs: list[list[float | None]]
    rounds: list[int]
    finish_step: list[int]
    engine_steps: int
    wall_seconds: float
    timed_out: bool = False


def is_cpu_platform() -> bool:
    """Whether the installed vLLM runs on the CPU platform."""
    from das_trl.vllm.engine import is_cpu_build

    return is_cpu_build()


def speculative_kwargs(drafter: str, num_speculative_tokens: int) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments that select ``drafter`` with K = ``num_speculative_tokens``.

    ``none``: nothing; ``ngram``: vLLM's prompt lookup (its default n-gram sizes); ``suffix``: vLLM's suffix decoding
    (arctic-inference, vLLM's defaults) plus :class:`SuffixHistoryExtension`; ``das``:
    :func:`das_trl.vllm.engine.das_engine_kwargs`.

    Raises:
        ValueError: unknown drafter name.
    """
    from das_trl.vllm.engine import das_engine_kwargs

    k = int(num_speculative_tokens)
    if drafter == "none":
        return {}
    if drafter == "ngram":
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k}}
    if drafter == "suffix":
        return {"speculative_config": {"method": "suffix", "num_speculative_tokens": k},
                "worker_extension_cls": SUFFIX_HISTORY_EXTENSION}
    if drafter == "das":
        return das_engine_kwargs(k)
    raise ValueError(f"unknown drafter {drafter!r}; choose from {', '.join(DRAFTERS)}")


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def engine_kwargs(cfg: LiveConfig, model: str, drafter: str, cpu: bool) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments of ``drafter``'s engine.

    CPU builds get an explicit KV cache (``kv_cache_bytes``), GPU builds ``gpu_memory_utilization``. Stats logging is
    on, so vLLM's ``spec_decode`` counters exist; ``logprobs_mode="processed_logprobs"`` as TRL sets it. Scheduling:
    the drafting engines run with async scheduling off (vLLM allows no other way with an ngram, suffix or
    custom_class drafter); ``none`` runs with vLLM's default, as a user's engine without speculation would (async
    scheduling on GPUs, off on the CPU build, which forces it off), so the baseline is not handicapped. The report
    records which scheduling each engine ran with (``async_scheduling``).

    Raises:
        ValueError: unknown drafter name.
    """
    kwargs: dict[str, Any] = dict(
        model=model,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        disable_log_stats=False,
        seed=cfg.seed,
        logprobs_mode="processed_logprobs",
        enforce_eager=cpu if cfg.enforce_eager is None else cfg.enforce_eager,
    )
    if drafter != "none":
        kwargs["async_scheduling"] = False  # what vLLM does anyway for these drafters; said explicitly
    if cpu:
        kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    kwargs.update(speculative_kwargs(drafter, cfg.num_speculative_tokens))
    return kwargs


def build_engine(cfg: LiveConfig, model: str, drafter: str, cpu: bool) -> Any:
    """A ``vllm.LLM`` for ``drafter`` (:func:`engine_kwargs`) whose engine core runs in this process (one ``step()`` =
    one scheduler step; with async scheduling a ``step()`` may return the outputs of the previous forward pass)."""
    from vllm import LLM

    kwargs = engine_kwargs(cfg, model, drafter, cpu)
    with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0"):
        return LLM(**kwargs)


def engine_async_scheduling(llm: Any) -> bool | None:
    """Whether ``llm``'s engine resolved to async scheduling (``vllm_config.scheduler_config.async_scheduling``);
    ``None`` when the engine does not say."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    value = getattr(getattr(config, "scheduler_config", None), "async_scheduling", None)
    return None if value is None else bool(value)


def shutdown_engine(llm: Any) -> None:
    """Release an engine (its engine core and memory) before the next one starts."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort on teardown
        pass
    del llm
    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def sampling_params(temperature: float, max_tokens: int) -> Any:
    """TRL colocate-mode sampling: ``n=1``, ``top_p=1``, ``top_k=-1``, ``min_p=0``, ``logprobs=0``; delta outputs."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(n=1, temperature=temperature, top_p=1.0, top_k=-1, min_p=0.0, repetition_penalty=1.0,
                          max_tokens=max_tokens, logprobs=0, output_kind=RequestOutputKind.DELTA)


def sampling_warnings(params: Any, speculative_config: dict[str, Any] | None, batch_size: int,
                      cpu_build: bool = False) -> list[str]:
    """Reasons speculation would be rejected, dropped or switched off for ``params`` in an engine with
    ``speculative_config``.

    Returns:
        human-readable warnings (empty when speculation will run as configured): the issues of
        :func:`das_trl.vllm.sampling_check.check_sampling_params` (``min_p``, ``logit_bias``, ``n > 1`` at temperature
        0, ...), and ``disable_by_batch_size`` at or below ``batch_size`` (vLLM stops drafting while that many
        requests run).
    """
    from das_trl.vllm.sampling_check import check_sampling_params

    if not speculative_config:
        return []
    out = [f"{i.severity} {i.param}={i.value!r}: {i.message}" for i in check_sampling_params(params, cpu_build)]
    limit = speculative_config.get("disable_by_batch_size")
    if limit is not None and batch_size >= int(limit):
        out.append(f"speculative_config disable_by_batch_size={limit} <= batch {batch_size}: vLLM drafts nothing "
                   "while that many requests run")
    return out


def run_batch(llm: Any, prompts: Sequence[Sequence[int]], samples: int, params: Any, tag: str,
              deadline: float | None = None) -> BatchResult:
    """Run ``samples`` requests of every prompt through ``llm`` step by step.

    Args:
        llm: a ``vllm.LLM`` built by :func:`build_engine` (engine core in this process).
        prompts: prompt token ids.
        samples: requests per prompt (GRPO group size), each with ``params`` (``n`` must be 1, output kind DELTA).
        tag: request-id prefix, unique per call.
        deadline: ``time.time()`` value after which the remaining requests are aborted (``timed_out`` set).

    Returns:
        a :class:`BatchResult`, requests in prompt-major order.
    """
    engine = llm.llm_engine
    rids = [f"{tag}-{i}-{j}" for i in range(len(prompts)) for j in range(samples)]
    index = {rid: k for k, rid in enumerate(rids)}
    tokens: list[list[int]] = [[] for _ in rids]
    logprobs: list[list[float | None]] = [[] for _ in rids]
    rounds = [0] * len(rids)
    finish = [0] * len(rids)
    started = time.perf_counter()
    for k, rid in enumerate(rids):
        engine.add_request(rid, {"prompt_token_ids": list(prompts[k // samples])}, params)
    step = 0
    timed_out = False
    while engine.has_unfinished_requests():
        if deadline is not None and time.time() > deadline:
            engine.abort_request([r for r in rids if not finish[index[r]]])
            timed_out = True
            break
        outputs = engine.step()
        step += 1
        for out in outputs:
            k = index.get(out.request_id)
            if k is None:
                continue
            comp = out.outputs[0]
            new = list(comp.token_ids)
            if new:
                rounds[k] += 1
                tokens[k].extend(new)
                lps = comp.logprobs or []
                got = [lp.get(t).logprob if lp and lp.get(t) is not None else None for lp, t in zip(lps, new)]
                logprobs[k].extend(got + [None] * (len(new) - len(got)))
            if out.finished:
                finish[k] = step
    return BatchResult(tokens, logprobs, rounds, finish, step, time.perf_counter() - started, timed_out)


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's cumulative ``spec_decode`` counters of ``llm`` (:func:`das_trl.vllm.metrics.spec_decode_counters`)."""
    from das_trl.vllm.metrics import spec_decode_counters

    return spec_decode_counters(llm)


def counter_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` for the counters of :func:`spec_counters`, with acceptance rates derived.

    Returns:
        ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` (ints), ``accepted_per_pos`` (list of int),
        ``acceptance_rate`` (accepted / draft tokens), ``acceptance_rate_per_pos`` (accepted at position i / drafts)
        and ``mean_acceptance_length`` (1 + accepted / drafts, vLLM's definition); rates are ``None`` without drafts.
    """
    d = {k: int(after[k]) - int(before.get(k, 0)) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    prev = list(before.get("accepted_per_pos", []))
    cur = list(after.get("accepted_per_pos", []))
    prev += [0] * (len(cur) - len(prev))
    d["accepted_per_pos"] = [int(a) - int(b) for a, b in zip(cur, prev)]
    drafts, draft_tokens = d["num_drafts"], d["num_draft_tokens"]
    d["acceptance_rate"] = d["num_accepted_tokens"] / draft_tokens if draft_tokens else None
    d["acceptance_rate_per_pos"] = [a / drafts for a in d["accepted_per_pos"]] if drafts else None
    d["mean_acceptance_length"] = 1 + d["num_accepted_tokens"] / drafts if drafts else None
    return d
