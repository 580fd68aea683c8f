"""Engine settings that cannot run the DAS drafter, refused before an engine starts.

vLLM itself rejects these, but late and deep inside its config validation (or inside a server subprocess whose log
the trainer never sees). Read from vLLM 0.32 (CPU build) and the vLLM 0.33.0 CUDA wheel:

- ``VLLM_USE_V2_MODEL_RUNNER=1``: the V2 model runner does not support ``speculative_config`` method
  ``custom_class`` (``VllmConfig._get_v2_model_runner_unsupported_features``); vLLM raises "Model Runner V2 does not
  yet support: speculative method 'custom_class'" (or, on CPU, "Model Runner V2 requires Triton").
- ``async_scheduling=True`` (``--async-scheduling``): async scheduling runs only with EAGLE/MTP/draft-model/ngram-GPU
  drafters; vLLM raises "Currently, async scheduling is only supported with EAGLE/MTP/...". Left unset, vLLM turns
  it off by itself for a ``custom_class`` drafter.
- ``data_parallel_size > 1`` on a server (``--data-parallel-size``, ``-dp``): vLLM's data-parallel client sends a
  ``/collective_rpc`` call to every engine but returns only engine 0's reply (``DPLBAsyncMPClient.call_utility_async``),
  so the trainer's history check (every engine's digest against its mirror) cannot see engines 1..N-1.
- ``pipeline_parallel_size > 1`` on vLLM 0.32 (``--pipeline-parallel-size``, ``-pp``): vLLM builds the drafter on the
  last stage only, and its ``GPUModelRunner.initialize_kv_cache_tensors`` then reads ``self.drafter`` on every stage
  whenever speculation is on, so the engine fails at start with "'...ModelRunner' object has no attribute 'drafter'"
  for any speculative method (vLLM issue #30436; seen on the CPU build of 0.32 with PP = 2). Other releases get a
  warning: das-trl itself handles stages without a drafter (they are skipped), but it has not run with PP > 1.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

#: vLLM's switch for its V2 model runner (parsed by vLLM as ``bool(int(value))``).
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

V2_RUNNER_MESSAGE = (
    "{env}={value!r} selects vLLM's V2 model runner, which cannot run a custom_class drafter such as DAS (vLLM 0.32 "
    "and 0.33 reject 'speculative method custom_class' there). Allowed: unset or 0. Next step: unset {env} (or set "
    "it to 0) in the environment of the process that builds the engine (the trainer in colocate mode, `das-trl "
    "serve` in server mode), or turn DAS off (das_enabled=False) to use the V2 runner without speculation."
)

ASYNC_SCHEDULING_MESSAGE = (
    "{where}={value!r}: vLLM's async scheduling cannot run with a custom_class drafter such as DAS (vLLM 0.32 and "
    "0.33 allow it only with EAGLE/MTP/draft-model/ngram-GPU speculation). Allowed: false or unset (vLLM then turns "
    "it off for DAS by itself). Next step: {fix}."
)

DATA_PARALLEL_MESSAGE = (
    "{where}={value}: a data-parallel vLLM server returns only engine 0's reply to /collective_rpc, so das-trl cannot "
    "check that every engine holds the trainer's drafter history (the digest check of each push). Allowed: 1. Next "
    "step: serve with --data-parallel-size 1 and use tensor parallelism (--tensor-parallel-size) for a larger "
    "model; for more rollout throughput run several single-engine servers (each checked on its own) or colocate "
    "mode (one engine per training process). See docs/gpu.md, 'Parallel engines'."
)


def _v2_runner_requested(environ: Mapping[str, str]) -> str | None:
    """The value of ``VLLM_USE_V2_MODEL_RUNNER`` when it turns the V2 runner on, else ``None``.

    vLLM reads it as ``bool(int(value))``: "1" (or any non-zero integer) turns it on, "0" off; a non-integer makes vLLM
    itself fail, so it is reported here too.
    """
    value = environ.get(V2_RUNNER_ENV)
    if value is None or value.strip() == "":
        return None
    try:
        return value if int(value) != 0 else None
    except ValueError:
        return value


def check_engine_settings(engine_kwargs: Mapping[str, Any] | None,
                          environ: Mapping[str, str] | None = None) -> None:
    """Refuse engine settings that cannot run the DAS drafter, before ``vllm.LLM`` is built.

    Args:
        engine_kwargs: keyword arguments for ``vllm.LLM`` / ``EngineArgs`` (e.g. ``das_vllm_kwargs`` merged with
            :func:`~das_trl.vllm.engine.das_engine_kwargs`); only ``async_scheduling`` is read.
        environ: the environment the engine will be built in (default ``os.environ``); ``{}`` skips the
            environment check.

    Raises:
        ValueError: ``async_scheduling`` is true, or ``VLLM_USE_V2_MODEL_RUNNER`` turns the V2 runner on; the message
            names the setting, its value, what is allowed and what to do.
    """
    environ = os.environ if environ is None else environ
    value = _v2_runner_requested(environ)
    if value is not None:
        raise ValueError(V2_RUNNER_MESSAGE.format(env=V2_RUNNER_ENV, value=value))
    if engine_kwargs and engine_kwargs.get("async_scheduling"):
        raise ValueError(ASYNC_SCHEDULING_MESSAGE.format(
            where="das_vllm_kwargs['async_scheduling']", value=engine_kwargs["async_scheduling"],
            fix="remove async_scheduling from das_vllm_kwargs (or set it to false)"))


PIPELINE_PARALLEL_MESSAGE = (
    "--pipeline-parallel-size={value}: vLLM 0.32 fails at engine start with speculative decoding and pipeline "
    "parallelism (the stages before the last have no drafter and vLLM reads it anyway: \"object has no attribute "
    "'drafter'\", vLLM issue #30436; seen with vLLM 0.32's CPU build). Allowed on vLLM 0.32: 1. Next step: split the "
    "model with --tensor-parallel-size instead, or use a vLLM release that fixes #30436 (das-trl skips the stages "
    "without a drafter)."
)

PIPELINE_PARALLEL_WARNING = (
    "--pipeline-parallel-size={value}: das-trl answers from the last stage's drafter and skips the other stages, but "
    "this has not run yet; vLLM 0.32 failed at start with speculation and pipeline parallelism (vLLM issue #30436). "
    "If the engine fails with \"no attribute 'drafter'\", use --tensor-parallel-size instead."
)

#: The vLLM releases on which speculative decoding with pipeline parallelism is known to fail at engine start.
PIPELINE_BROKEN_RELEASES = ((0, 32),)


def _server_flag_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    return parser


def _server_flags(vllm_args: Sequence[str]) -> argparse.Namespace:
    flags, _ = _server_flag_parser().parse_known_args([_normalize_flag(t) for t in vllm_args])
    return flags


def _normalize_flag(token: str) -> str:
    """``--async_scheduling=x`` -> ``--async-scheduling=x``: vLLM's parser accepts underscores in long flags."""
    if not token.startswith("--"):
        return token
    name, sep, value = token.partition("=")
    return name.replace("_", "-") + sep + value


def check_server_args(vllm_args: Sequence[str], environ: Mapping[str, str] | None = None,
                      release: tuple[int, ...] = ()) -> list[str]:
    """Problems with the vLLM flags and environment of a ``das-trl serve`` call; empty when the server can start.

    Args:
        vllm_args: the flags passed through to vLLM's server (``das-trl serve``'s unrecognised arguments).
        environ: the server's environment (default ``os.environ``).
        release: the installed vLLM's release numbers (e.g. ``(0, 32, 0)``; ``()``: unknown), for the
            version-specific refusals.

    Returns:
        one message per problem (``--async-scheduling``, ``--data-parallel-size``/``-dp`` > 1,
        ``--pipeline-parallel-size``/``-pp`` > 1 on vLLM 0.32, ``VLLM_USE_V2_MODEL_RUNNER``), each naming the flag,
        its value, the allowed values and the next step.
    """
    environ = os.environ if environ is None else environ
    problems = []
    value = _v2_runner_requested(environ)
    if value is not None:
        problems.append(V2_RUNNER_MESSAGE.format(env=V2_RUNNER_ENV, value=value))
    flags = _server_flags(vllm_args)
    if flags.async_scheduling:
        problems.append(ASYNC_SCHEDULING_MESSAGE.format(
            where="--async-scheduling", value=True, fix="drop --async-scheduling from the das-trl serve command"))
    if flags.data_parallel_size != 1:
        problems.append(DATA_PARALLEL_MESSAGE.format(where="--data-parallel-size", value=flags.data_parallel_size))
    if flags.pipeline_parallel_size > 1 and tuple(release[:2]) in PIPELINE_BROKEN_RELEASES:
        problems.append(PIPELINE_PARALLEL_MESSAGE.format(value=flags.pipeline_parallel_size))
    return problems


def server_arg_warnings(vllm_args: Sequence[str], release: tuple[int, ...] = ()) -> list[str]:
    """Settings of a ``das-trl serve`` call that may work but have not run (pipeline parallelism on a vLLM release
    other than the ones :func:`check_server_args` refuses it on).

    Returns:
        one message per warning (empty when there is nothing to warn about).
    """
    flags = _server_flags(vllm_args)
    if flags.pipeline_parallel_size > 1 and tuple(release[:2]) not in PIPELINE_BROKEN_RELEASES:
        return [PIPELINE_PARALLEL_WARNING.format(value=flags.pipeline_parallel_size)]
    return []
