"""Engine settings that cannot run the DAS drafter, refused before an engine starts.

vLLM itself rejects these, but late and deep inside its config validation (or inside a server subprocess whose log
the trainer never sees). Read from vLLM 0.32 (CPU build) and the vLLM 0.33.0 CUDA wheel:

- ``VLLM_USE_V2_MODEL_RUNNER=1``: the V2 model runner does not support ``speculative_config`` method
  ``custom_class`` (``VllmConfig._get_v2_model_runner_unsupported_features``); vLLM raises "Model Runner V2 does not
  yet support: speculative method 'custom_class'" (or, on CPU, "Model Runner V2 requires Triton").
- ``async_scheduling=True`` (``--async-scheduling``): async scheduling runs only with EAGLE/MTP/draft-model/ngram-GPU
  drafters; vLLM 0.32 raises "Currently, async scheduling is only supported with EAGLE/MTP/..." and 0.33 "Async
  scheduling is not supported by the V1 model runner with custom_class-based speculative decoding"
  (``VllmConfig.__post_init__``). Left unset, vLLM turns it off by itself for a ``custom_class`` drafter.
- ``pipeline_parallel_size > 1`` (``--pipeline-parallel-size``, ``-pp``) on every vLLM release: vLLM builds the drafter
  on the last stage only (``GPUModelRunner.__init__``: ``if self.speculative_config and
  get_pp_group().is_last_rank``) and its ``GPUModelRunner.initialize_kv_cache_tensors`` then reads ``self.drafter`` on
  every stage whenever speculation is on, so the engine fails at start with "'...ModelRunner' object has no
  attribute 'drafter'" for any speculative method (vLLM issue #30436: seen on the CPU build of 0.32 with PP = 2; the
  same code is in the 0.33.0 CUDA wheel's ``vllm/v1/worker/gpu_model_runner.py``). A release is allowed once it is
  verified (:data:`PIPELINE_VERIFIED_RELEASES`, empty so far).
- data-parallel load-balancing modes in which one API server does not reach every engine (``--data-parallel-external-lb``,
  ``--data-parallel-rank``, ``--data-parallel-hybrid-lb``, ``--data-parallel-start-rank``,
  ``--data-parallel-multi-port-external-lb``, ``--headless``): das-trl checks every engine's history through one
  server. ``--data-parallel-size N`` itself (vLLM's internal load balancer) is supported: das-trl's endpoint plugin
  returns every engine's replies (:mod:`das_trl.vllm.endpoints`).
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

DATA_PARALLEL_LB_MESSAGE = (
    "{flag}: with this data-parallel load-balancing mode an API server does not reach every engine, so das-trl could "
    "not push the drafter history to every engine and check it there. Allowed: --data-parallel-size N with vLLM's "
    "internal load balancer (the default), where the one server reaches all N engines. Next step: drop {flag}, or "
    "run one `das-trl serve` per engine group and give each its own trainer. See docs/gpu.md, 'Parallel engines'."
)

#: The ``das-trl serve`` flags of the data-parallel modes refused above (each takes a value unless noted).
DATA_PARALLEL_LB_FLAGS = ("--data-parallel-external-lb", "--data-parallel-rank", "--data-parallel-hybrid-lb",
                          "--data-parallel-start-rank", "--data-parallel-multi-port-external-lb", "--headless")

#: vLLM flags that set what ``das-trl serve`` sets itself for the DAS drafter (vLLM 0.32 / 0.33
#: ``EngineArgs.add_cli_args``): given again they replace das-trl's (vLLM keeps the last value) or clash with it
#: (``--spec-*``: "... and --speculative-config[...] are mutually exclusive"), and the drafter cannot attach.
DAS_OWNED_FLAGS = ("--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens",
                   "--worker-extension-cls")

DAS_OWNED_MESSAGE = (
    "{flag}: das-trl serve sets vLLM's speculative config (the DAS proposer) and worker extension itself; a flag of "
    "your own would replace or clash with them and the drafter could not attach. Allowed: leave it out (K is "
    "--num-speculative-tokens, the drafter's settings --drafter-config). Next step: drop {flag}; to serve another "
    "speculative method, start vLLM without das-trl."
)

#: Sizes a server needs at least one of (vLLM's own configs require >= 1; refused here before vLLM's start-up).
POSITIVE_SERVER_FLAGS = (("--max-num-seqs", "max_num_seqs"), ("--data-parallel-size", "data_parallel_size"),
                         ("--pipeline-parallel-size", "pipeline_parallel_size"))


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
    "--pipeline-parallel-size={value}: vLLM {release} cannot start an engine with speculative decoding and pipeline "
    "parallelism: it builds the drafter on the last stage only and reads it on every stage (\"object has no "
    "attribute 'drafter'\", vLLM issue #30436; seen with vLLM 0.32's CPU build, and the same code is in vLLM 0.33's "
    "gpu_model_runner.py). Allowed: 1 (no vLLM release has been verified with pipeline parallelism and DAS). Next "
    "step: split the model with --tensor-parallel-size instead (das-trl drafts on tensor-parallel rank 0)."
)

#: The vLLM releases (major, minor) verified to run speculative decoding with pipeline parallelism: none so far
#: (0.32 fails at start, vLLM issue #30436; 0.33.0 still has the same code). Pipeline parallelism is refused on the
#: others.
PIPELINE_VERIFIED_RELEASES: tuple[tuple[int, int], ...] = ()


class _RaisingParser(argparse.ArgumentParser):
    """Reports a malformed flag value as ``ValueError`` (the caller words it), never with its own usage and exit."""

    def error(self, message: str):
        raise ValueError(message)


def _server_flag_parser() -> argparse.ArgumentParser:
    # The flags as vLLM 0.32's server parser defines them (vllm/engine/arg_utils.py; short forms included).
    parser = _RaisingParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    parser.add_argument("--max-num-batched-tokens", type=str, default=None)  # vLLM also reads "8k"
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--data-parallel-external-lb", "-dpe", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--data-parallel-hybrid-lb", "-dph", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--data-parallel-multi-port-external-lb", "-dpm", action="store_true", default=None)
    parser.add_argument("--headless", action="store_true", default=None)
    parser.add_argument("--data-parallel-rank", "-dpn", type=int, default=None)
    parser.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None)
    return parser


def server_flag(vllm_args: Sequence[str], name: str) -> Any:
    """The value of one vLLM server flag among ``vllm_args`` as vLLM's parser reads it (``name``: the flag's
    destination, e.g. ``"max_num_seqs"``; ``None`` when absent). Flags read: ``--async-scheduling``,
    ``--data-parallel-size``/``-dp``, ``--pipeline-parallel-size``/``-pp``, ``--max-num-batched-tokens``,
    ``--max-num-seqs`` and the data-parallel load-balancing flags."""
    return getattr(_server_flags(vllm_args), name)


def _server_flags(vllm_args: Sequence[str]) -> argparse.Namespace:
    """The flags :func:`server_flag` reads, parsed as vLLM parses them.

    Raises:
        ValueError: a value vLLM's parser would reject too (``--pipeline-parallel-size two``), as
            ``"argument --pipeline-parallel-size/-pp: invalid int value: 'two'"``.
    """
    try:
        flags, _ = _server_flag_parser().parse_known_args([_normalize_flag(t) for t in vllm_args])
    except argparse.ArgumentError as exc:
        raise ValueError(str(exc)) from None
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
        one message per problem (``--async-scheduling``, ``--pipeline-parallel-size``/``-pp`` > 1 on a release not
        in :data:`PIPELINE_VERIFIED_RELEASES`, a data-parallel load-balancing mode in which one server does not reach
        every engine, ``VLLM_USE_V2_MODEL_RUNNER``, a flag of :data:`DAS_OWNED_FLAGS`, a count of
        :data:`POSITIVE_SERVER_FLAGS` below 1), each naming the flag, its value, the allowed values and the next
        step. ``--data-parallel-size N`` alone is allowed.
    """
    environ = os.environ if environ is None else environ
    problems = []
    value = _v2_runner_requested(environ)
    if value is not None:
        problems.append(V2_RUNNER_MESSAGE.format(env=V2_RUNNER_ENV, value=value))
    try:
        flags = _server_flags(vllm_args)
    except ValueError as exc:
        return [*problems, f"{exc} (a flag passed on to vLLM's server, whose parser refuses it too). Next step: give "
                           "the value vLLM expects (`vllm serve --help` lists each flag's type)."]
    for token in vllm_args:
        name = _normalize_flag(token).partition("=")[0]
        flag = name if name in DAS_OWNED_FLAGS else name.partition(".")[0]  # vLLM also reads --speculative-config.KEY
        if flag in DAS_OWNED_FLAGS:
            problems.append(DAS_OWNED_MESSAGE.format(flag=flag))
    for flag, dest in POSITIVE_SERVER_FLAGS:
        value = getattr(flags, dest)
        if value is not None and value < 1:
            problems.append(f"{flag} {value}: allowed 1 or more. Next step: give a positive count, or leave the flag "
                            "out for the default.")
    if flags.async_scheduling:
        problems.append(ASYNC_SCHEDULING_MESSAGE.format(
            where="--async-scheduling", value=True, fix="drop --async-scheduling from the das-trl serve command"))
    for flag in DATA_PARALLEL_LB_FLAGS:
        set_to = getattr(flags, flag.removeprefix("--").replace("-", "_"))
        if set_to is not None and set_to is not False:
            problems.append(DATA_PARALLEL_LB_MESSAGE.format(flag=flag if set_to is True else f"{flag}={set_to}"))
    if flags.pipeline_parallel_size > 1 and tuple(release[:2]) not in PIPELINE_VERIFIED_RELEASES:
        shown = ".".join(str(p) for p in release[:2]) or "(release unknown)"
        problems.append(PIPELINE_PARALLEL_MESSAGE.format(value=flags.pipeline_parallel_size, release=shown))
    return problems
