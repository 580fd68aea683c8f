"""The ``trl vllm-serve`` command line that serves DAS, derived from ``das-trl serve``'s own server command.

TRL 1.16's ``trl vllm-serve`` (``trl/scripts/vllm_serve.py``) runs ``python -m vllm.entrypoints.cli.main serve`` with
dev mode, ``--logprobs-mode processed_logprobs``, ``--max-logprobs -1``, ``--enable-scale-out`` (vLLM >= 0.30) and the
NCCL ``--weight-transfer-config``, takes ``--speculative-config`` as its own field, and forwards every argument it does
not know to ``vllm serve`` as-is; its fields accept vLLM's dashed spellings (``--gpu-memory-utilization``,
``--max-model-len``, ``--dtype``, ``--host``, ``--port``). So the DAS server it starts is ``das-trl serve``'s: the same
vLLM flags (:func:`das_trl.vllm.serve.build_command`) without those TRL sets itself, and the same environment
(``VLLM_PLUGINS`` with das-trl's endpoint plugin, which a data-parallel server needs; the payload limit), printed by
``das-trl serve --print-trl-command``. Two things ``das-trl serve`` does that a ``trl vllm-serve`` server leaves to the
trainer: attaching the drafter (``DASGRPOTrainer`` attaches it at start, with its ``das_*`` settings) and checking the
settings before the engine starts (vLLM then reports them, later and deeper).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

#: ``das-trl serve``'s server module (its command starts ``python -m`` this module).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: Flags ``trl vllm-serve`` sets itself (TRL 1.16 ``build_command``), with how many values each takes.
TRL_SETS = {"--logprobs-mode": 1, "--max-logprobs": 1, "--enable-scale-out": 0, "--weight-transfer-config": 1}
#: vLLM switches that ``trl vllm-serve`` reads as fields of its own taking a value (TRL 1.16 ``ScriptArguments``:
#: ``enable_prefix_caching: bool | None``; a bare ``--enable-prefix-caching`` stops its parser with "expected one
#: argument"), with the value that means the bare switch. TRL passes ``--enable-prefix-caching`` on to vLLM for it.
TRL_VALUED_SWITCHES = {"--enable-prefix-caching": "true", "--enable_prefix_caching": "true"}
#: The environment variables ``das-trl serve`` sets that a ``trl vllm-serve`` command must carry (TRL sets
#: ``VLLM_SERVER_DEV_MODE=1`` itself).
CARRIED_ENV = ("VLLM_PLUGINS", "DAS_TRL_MAX_PAYLOAD_BYTES")


def trl_serve_command(server_command: Sequence[str]) -> list[str]:
    """``["trl", "vllm-serve", ...]``: the flags of a ``das-trl serve`` server command, for TRL's wrapper.

    Args:
        server_command: :func:`das_trl.vllm.serve.build_command`'s output (``[python, "-m", SERVER_MODULE, flags...]``).

    Returns:
        the command, the flags in their order, without those in :data:`TRL_SETS`, and with the value TRL's parser
        needs after a bare switch of :data:`TRL_VALUED_SWITCHES`.

    Raises:
        ValueError: ``server_command`` does not run :data:`SERVER_MODULE`.
    """
    command = list(server_command)
    if command[1:3] != ["-m", SERVER_MODULE]:
        raise ValueError(f"not a das-trl serve server command (expected python -m {SERVER_MODULE}): {command[:3]}")
    flags, out, i = command[3:], [], 0
    while i < len(flags):
        name = flags[i].split("=", 1)[0]
        if name in TRL_SETS:
            i += 1 + (TRL_SETS[name] if "=" not in flags[i] else 0)
            continue
        out.append(flags[i])
        if flags[i] in TRL_VALUED_SWITCHES:
            out.append(TRL_VALUED_SWITCHES[flags[i]])
        i += 1
    return ["trl", "vllm-serve", *out]


def command_line(command: Sequence[str], environ: Mapping[str, str]) -> str:
    """``command`` as one shell line, prefixed with the :data:`CARRIED_ENV` variables set in ``environ``."""
    prefix = [f"{name}={shlex.quote(environ[name])}" for name in CARRIED_ENV if environ.get(name)]
    return " ".join([*prefix, shlex.join(command)])
