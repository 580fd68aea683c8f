"""vLLM endpoint plugin ``das_trl_rpc``: ``POST /das/collective_rpc``, the worker RPCs of *every* data-parallel engine.

vLLM's dev-mode ``POST /collective_rpc`` awaits ``EngineClient.collective_rpc``, a utility call through
``AsyncMPClient.call_utility_async``. On a data-parallel server (``DPLBAsyncMPClient``, vLLM's internal load
balancer) that sends the call to every engine but returns only engine 0's reply (``vllm/v1/engine/core_client.py``,
``DPLBAsyncMPClient.call_utility_async``, vLLM 0.32 and 0.33). This route makes the same utility call
(``"collective_rpc"``, whose engine-side ``EngineCore.collective_rpc(method, timeout, args, kwargs)`` runs the worker
method) with ``AsyncMPClient.call_utility_all_async``, which returns one reply per engine in engine-rank order (vLLM's
own ``compute_weight_checksums_async`` uses it the same way). So every engine's history pushes, digests, stats,
resets, weight reloads and restores come back and are checked (:class:`das_trl.vllm.client.HTTPDASEngine`).

Request: ``{"method": "das_...", "args": [str, ...], "kwargs": {str: str}, "timeout": seconds or null}``; only the DAS
worker-extension methods (names starting with ``das_``) are served. Reply: ``{"engines": [[worker reply, ...], ...],
"data_parallel_size": N}``: one list per engine, each holding that engine's worker replies (tensor/pipeline-parallel
ranks) in rank order, and the server's data-parallel size.

vLLM's endpoint-plugin contract (``vllm/plugins/endpoint_plugins/interface.py``) asks plugins to reach the engine
through ``EngineClient`` (e.g. ``collective_rpc``); on a data-parallel server that answers for engine 0 only, so this
route goes one level down, to the core client's ``call_utility_all_async``, the call vLLM's own all-engines methods
make. A core client without it (in-process engines) is asked through ``EngineClient.collective_rpc``.

Loading: vLLM loads endpoint plugins only when ``VLLM_PLUGINS`` names them (``vllm/plugins/__init__.py``,
``load_endpoint_plugins``); ``das-trl serve`` sets it (:func:`plugin_allowlist`). Like ``/collective_rpc``, the route
exists only in dev mode (``VLLM_SERVER_DEV_MODE=1``, which ``das-trl serve`` sets).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from fastapi import Request  # a vLLM dependency; FastAPI injects the request by this annotation

logger = logging.getLogger("vllm.das_trl.endpoints")

#: The entry point's name (group ``vllm.endpoint_plugins``), which ``VLLM_PLUGINS`` must list.
PLUGIN_NAME = "das_trl_rpc"
#: The route's path.
ROUTE = "/das/collective_rpc"
#: Only worker methods with this prefix (the DAS worker extension's) are served.
METHOD_PREFIX = "das_"
_ENDPOINT_GROUP = "vllm.endpoint_plugins"


async def all_engine_rpc(engine_client: Any, method: str, timeout: float | None = None, args: tuple = (),
                         kwargs: Mapping[str, Any] | None = None) -> list[list[Any]]:
    """Run worker method ``method`` on every worker of every engine behind ``engine_client``.

    Args:
        engine_client: vLLM's ``EngineClient`` (``AsyncLLM``), whose ``engine_core`` is an ``AsyncMPClient``
            (one engine), a ``DPLBAsyncMPClient`` (data parallel, internal load balancing) or another core client.
        method, timeout, args, kwargs: as ``EngineClient.collective_rpc``.

    Returns:
        one list of worker replies per engine, engines in rank order (``[[...]]`` for a single engine or a core
        client without ``call_utility_all_async``, which then answers through ``collective_rpc``).

    Raises:
        whatever the engines' utility call raises (an engine that died, a worker method that raised).
    """
    core = getattr(engine_client, "engine_core", None)
    call_all = getattr(core, "call_utility_all_async", None)
    if call_all is None:
        return [list(await engine_client.collective_rpc(method, timeout=timeout, args=args, kwargs=kwargs))]
    replies = await call_all("collective_rpc", method, timeout, tuple(args), dict(kwargs or {}))
    return [list(engine_replies or []) for engine_replies in replies]


def _jsonable(value: Any) -> Any:
    """A worker reply as JSON (dicts and lists as they are, anything else as text, as vLLM's route does)."""
    return value if value is None or isinstance(value, (dict, list, str, int, float, bool)) else str(value)


def _bad_request(detail: str):
    from fastapi import HTTPException

    return HTTPException(status_code=400, detail=detail)


async def das_collective_rpc(raw_request: Request):
    """The route's handler (FastAPI): validates the body, runs :func:`all_engine_rpc`, returns ``{"engines": ...}``.

    Raises:
        fastapi.HTTPException: 400 for a body that is not JSON, a method outside ``das_*``, or arguments that are not
            strings.
    """
    import json

    from fastapi.responses import JSONResponse

    try:
        body = await raw_request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad_request(f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise _bad_request("the request body must be a JSON object")
    method = body.get("method")
    if not isinstance(method, str) or not method.startswith(METHOD_PREFIX):
        raise _bad_request(f"method must be a DAS worker method (a name starting with {METHOD_PREFIX!r}), got "
                           f"{method!r}; other worker methods are served by /collective_rpc")
    args = body.get("args", [])
    kwargs = body.get("kwargs", {})
    timeout = body.get("timeout")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _bad_request("args must be a list of strings")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in kwargs.items()):
        raise _bad_request("kwargs must be an object of strings")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise _bad_request(f"timeout must be a positive number of seconds or null, got {timeout!r}")
    replies = await all_engine_rpc(raw_request.app.state.engine_client, method, timeout, tuple(args), kwargs)
    # The API server's own config keeps the data-parallel size; engines of a dense model each see 1 (vLLM runs them
    # as independent replicas: ParallelConfig.reconfigure_for_independent_dp_rank in EngineCoreProc.run_engine_core).
    parallel = getattr(getattr(raw_request.app.state, "vllm_config", None), "parallel_config", None)
    size = getattr(parallel, "data_parallel_size", None)
    return JSONResponse(content={"engines": [[_jsonable(r) for r in engine] for engine in replies],
                                 "data_parallel_size": size if isinstance(size, int) else len(replies)})


def _dev_mode() -> bool:
    try:
        from vllm import envs

        return bool(envs.VLLM_SERVER_DEV_MODE)
    except Exception:  # noqa: BLE001 - outside vLLM: read the variable as vLLM does
        return bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0") or "0"))


class DASEndpointPlugin:
    """The ``vllm.endpoint_plugins`` entry point (vLLM's ``EndpointPlugin`` protocol,
    ``vllm/plugins/endpoint_plugins/interface.py``): adds :data:`ROUTE` to a generating API server in dev mode."""

    name = PLUGIN_NAME
    #: Only servers that generate (the render-only server has no engine).
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        """Add ``POST /das/collective_rpc`` to ``app`` (dev mode only; otherwise a log line says why not)."""
        if not _dev_mode():
            logger.warning("das-trl endpoint plugin: VLLM_SERVER_DEV_MODE is not set, so %s is not served (as "
                           "/collective_rpc is not)", ROUTE)
            return
        app.add_api_route(ROUTE, das_collective_rpc, methods=["POST"])

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        """Nothing to set up: the route reads vLLM's own ``app.state.engine_client``."""


def plugin_allowlist(environ: Mapping[str, str] | None = None) -> str:
    """The ``VLLM_PLUGINS`` value that loads :data:`PLUGIN_NAME` and changes nothing else.

    vLLM loads endpoint plugins only when ``VLLM_PLUGINS`` names them, and the same variable is then an allowlist for
    every other plugin group (general, platform, I/O processor, stat logger plugins). So: when it is unset, every
    plugin installed in the other ``vllm.*`` entry-point groups is listed (all of them load, as before) plus ours;
    when the user set it, ours is added to their list (a list without ``das_trl``, the general plugin with the CPU
    sampling fix, stays without it).

    Args:
        environ: the environment the server will start with (default ``os.environ``).

    Returns:
        a comma-separated list, as vLLM parses it (``split(",")``).
    """
    from importlib.metadata import entry_points

    environ = os.environ if environ is None else environ
    current = environ.get("VLLM_PLUGINS")
    if current is not None:
        names = [name for name in current.split(",") if name]
    else:
        discovered = entry_points()
        names = sorted({ep.name for group in discovered.groups if group.startswith("vllm.") and group != _ENDPOINT_GROUP
                        for ep in discovered.select(group=group)})
    if PLUGIN_NAME not in names:
        names.append(PLUGIN_NAME)
    return ",".join(names)
