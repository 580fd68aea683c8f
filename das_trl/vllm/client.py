"""Clients for engines that run DAS: the same calls over HTTP (a ``das-trl serve`` / ``vllm serve`` process) or
in-process (a ``vllm.LLM``), both through vLLM's ``collective_rpc`` and the worker extension's ``das_*`` methods.

Each engine may have several workers (tensor/pipeline parallel): an RPC returns one result per worker, and a call only
succeeds if every worker that drafts says ``ok``. Workers that do not draft (pipeline stages before the last,
tensor-parallel ranks other than 0) answer ``no_drafter`` and are skipped; at least one worker must draft.

A data-parallel server (``--data-parallel-size N``) runs N engines behind one API server. ``das-trl serve`` loads
das-trl's endpoint plugin (:mod:`das_trl.vllm.endpoints`), whose ``POST /das/collective_rpc`` returns every engine's
replies; :class:`HTTPDASEngine` uses it when the server has it (each reply tagged with its ``"engine"`` rank), so a
push, digest, reset or reload is checked on every engine. A call that succeeds on some engines and fails on others
raises :class:`PartialEngineError` (the trainer then reloads its history into every engine at once). A data-parallel
server without the route (vLLM's ``/collective_rpc`` returns engine 0's replies only) is refused at
:meth:`DASEngine.attach`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from das_trl.vllm.payload import encode_history_state, encode_rollouts


class DASEngineError(RuntimeError):
    """An engine is unreachable, is not a DAS engine, or rejected a DAS call; the message says what to do."""


class NotDASEngineError(DASEngineError):
    """A server answers but does not run DAS (no dev mode, no DAS worker extension or no DAS drafter); the message
    names the commands that start one that does."""


class PartialEngineError(DASEngineError):
    """A DAS call succeeded on some drafting workers (data-parallel engines) and failed on others: their histories
    now differ. The message names the failed engines; reload the history into every engine to repair them."""


#: Why a data-parallel server without das-trl's all-engines route is refused (format: where, value, answered).
DATA_PARALLEL_UNCHECKED_MESSAGE = (
    "{where}={value}, but only {answered} of its {value} engines answered: this server returns engine 0's replies "
    "only (vLLM's /collective_rpc on a data-parallel server), so das-trl cannot check that every engine holds the "
    "trainer's drafter history. Next step: start the server with `das-trl serve --data-parallel-size {value}` (it "
    "loads das-trl's endpoint plugin, POST /das/collective_rpc, which returns every engine's replies), or start vLLM "
    "with VLLM_SERVER_DEV_MODE=1 and VLLM_PLUGINS listing das_trl_rpc (and your other plugins; `das-trl serve "
    "--print-trl-command --data-parallel-size {value}` prints the trl vllm-serve line with it). One API server must "
    "reach all engines (vLLM's internal load balancing, the default); with external load balancing, give each "
    "engine's server to its own trainer. See docs/gpu.md, 'Parallel engines'."
)


def normalize_server_url(url: str) -> str:
    """A server address as the HTTP clients need it: ``http://`` added when no scheme is given
    (``"localhost:8000"`` -> ``"http://localhost:8000"``), trailing slashes removed.

    Raises:
        ValueError: an empty address, a scheme other than http/https, or no host.
    """
    from urllib.parse import urlparse

    text = url.strip().rstrip("/")
    if "://" not in text:
        text = f"http://{text}"
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"server address {url!r}: expected [http://]HOST:PORT, e.g. http://127.0.0.1:8000")
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise ValueError(f"server address {url!r}: {exc}; expected [http://]HOST:PORT") from None
    return text


class DASEngine:
    """Common client logic; subclasses provide :meth:`rpc`."""

    name = "engine"
    #: ``parallel`` and ``limits`` sections of the last :meth:`attach` reply (worker_extension.parallel_layout and
    #: engine_limits): data-parallel size, model length, batched tokens, K. Empty before an attach.
    layout: dict[str, Any] = {}
    limits: dict[str, Any] = {}

    def rpc(self, method: str, *args: str, timeout: float | None = None) -> list[Any]:
        """Run worker method ``method`` with string ``args`` on every worker; returns one result per worker (every
        engine's workers for a data-parallel server, each dict reply tagged with its ``"engine"`` rank)."""
        raise NotImplementedError

    def _das_call(self, method: str, *args: str, timeout: float | None = None) -> list[dict[str, Any]]:
        """Run ``method`` on every worker; returns the replies of the workers that draft, in worker order.

        Replies marked ``no_drafter`` (ranks where vLLM runs no drafter) are left out.

        Raises:
            DASEngineError: no reply, a reply that is not a dict, drafting workers that all failed, or no worker that
                drafts.
            PartialEngineError: some drafting workers succeeded and others failed (data-parallel engines).
        """
        results = self.rpc(method, *args, timeout=timeout)
        if not results:
            raise DASEngineError(f"{self.name}: {method} returned no worker results")
        return _drafting_replies(self.name, method, results)

    def attach(self, drafter_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Attach the proposer in every drafting worker (vLLM 0.32 needs this once after start); returns the first
        drafting worker's stats.

        Also keeps the reply's ``parallel`` and ``limits`` sections in :attr:`layout` and :attr:`limits`.

        Raises:
            DASEngineError: the engine does not run the DAS proposer, the config is invalid, or the engine is
                data-parallel (``data_parallel_size > 1`` outside TRL's ``external_launcher`` colocate mode) and not
                every engine answered (a server without das-trl's all-engines route returns engine 0's replies only,
                so the history check could not see the other engines).
        """
        config_json = json.dumps(drafter_config) if drafter_config else ""
        replies = self._das_call("das_attach", config_json)
        layout = dict(replies[0].get("parallel") or {})
        data_parallel = max(int(layout.get("data_parallel_size", 1)), self.data_parallel_size())
        layout["data_parallel_size"] = data_parallel
        if data_parallel > 1 and layout.get("distributed_executor_backend") != "external_launcher":
            answered = len({reply.get("engine", 0) for reply in replies})
            if answered < data_parallel:
                raise DASEngineError(f"{self.name}: " + DATA_PARALLEL_UNCHECKED_MESSAGE.format(
                    where="data_parallel_size", value=data_parallel, answered=answered))
        self.layout = dict(layout)
        self.limits = dict(replies[0].get("limits") or {})
        return replies[0]["stats"]

    def data_parallel_size(self) -> int:
        """How many data-parallel engines serve behind this client, as the front end knows it (1 here; a server
        says, :meth:`HTTPDASEngine.data_parallel_size`). The workers of a dense model's data-parallel engines each
        report 1, so :meth:`attach` takes the larger of the two."""
        return 1

    def detach(self) -> dict[str, Any]:
        """Stop drafting in every worker (history kept); returns the first drafting worker's stats."""
        return self._das_call("das_detach")[0]["stats"]

    def stats(self) -> dict[str, Any]:
        """The first drafting worker's :meth:`~das_trl.vllm.proposer.DASProposer.stats`."""
        return self._das_call("das_stats")[0]["stats"]

    def worker_stats(self) -> list[dict[str, Any]]:
        """Every drafting worker's stats (to compare histories across workers)."""
        return [r["stats"] for r in self._das_call("das_stats")]

    def add_history(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        problem_keys: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """Push one step's rollouts into every worker's history.

        Returns:
            the first drafting worker's reply: ``{"ok", "added": {...}, "seconds", "stats"}``.

        Raises:
            DASEngineError: a worker rejected the payload (its history is unchanged).
        """
        payload = encode_rollouts(prompts, completions, problem_keys)
        return self._das_call("das_add_history", payload)[0]

    def history_digests(self) -> list[str]:
        """Every drafting worker's history digest (:func:`das_trl.drafter.digest.state_digest`), worker order (engine
        by engine on a data-parallel server).

        Raises:
            DASEngineError: unreachable, or not a DAS engine.
        """
        return list(self.labelled_history_digests().values())

    def labelled_history_digests(self) -> dict[str, str]:
        """:meth:`history_digests` keyed by worker: ``"worker <i>"``, or ``"engine <e> worker <i>"`` where the replies
        name their data-parallel engine.

        Raises:
            DASEngineError: unreachable, or not a DAS engine.
        """
        return {label: str(r["digest"]) for label, r in _labels(self._das_call("das_history_digest"))}

    def load_history(self, state: dict[str, Any]) -> dict[str, Any]:
        """Replace every worker's history with ``state`` (:meth:`das_trl.drafter.RolloutHistory.to_state` output).

        Returns:
            the first drafting worker's reply ``{"ok", "digest", "seconds", "stats"}``.

        Raises:
            DASEngineError: a worker rejected the state (e.g. over the payload limit; its history is unchanged).
        """
        return self._das_call("das_load_history", encode_history_state(state))[0]

    def reset(self, what: str = "all") -> dict[str, Any]:
        """Reset ``"counters"``, ``"history"`` or ``"all"``."""
        return self._das_call("das_reset", what)[0]["stats"]

    def check_das(self) -> dict[str, Any]:
        """Verify the engine runs DAS and its proposer is attached (attaching it if not); returns its stats.

        Raises:
            DASEngineError: unreachable, not dev mode, no DAS worker extension, or no DAS proposer.
        """
        stats = self.stats()
        if not stats.get("attached"):
            stats = self.attach()
        return stats


def _labels(replies: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, reply)`` per drafting reply: ``"worker <i>"`` counted per engine, prefixed by ``"engine <e> "`` when
    the replies name their engine."""
    out, seen = [], {}
    for reply in replies:
        engine = reply.get("engine")
        index = seen.get(engine, 0)
        seen[engine] = index + 1
        out.append((f"worker {index}" if engine is None else f"engine {engine} worker {index}", reply))
    return out


def _drafting_replies(name: str, method: str, results: Sequence[Any]) -> list[dict[str, Any]]:
    """The replies of the workers that draft, in order; see :meth:`DASEngine._das_call` for what raises."""
    drafting, failed = [], []
    for result in results:
        if not isinstance(result, dict):
            raise DASEngineError(f"{name}: {method} returned {result!r}, expected a dict: not a DAS engine?")
        if result.get("no_drafter"):
            continue
        (drafting if result.get("ok") else failed).append(result)
    if failed:
        def where(reply: dict[str, Any]) -> str:
            return f"engine {reply['engine']}: " if "engine" in reply else ""

        text = "; ".join(f"{where(r)}{r.get('error', r)}" for r in failed)
        if drafting:
            done = sorted({str(r.get("engine", "?")) for r in drafting})
            raise PartialEngineError(
                f"{name}: {method} failed on {len(failed)} of {len(failed) + len(drafting)} drafting workers ({text}); "
                f"it succeeded on engine(s) {', '.join(done)}, so the engines' histories now differ")
        raise DASEngineError(f"{name}: {method} failed: {text}")
    if not drafting:
        raise DASEngineError(
            f"{name}: {method}: none of its {len(results)} workers runs a DAS drafter "
            f"({results[0].get('error')}). At least one must: vLLM builds the drafter on the last pipeline stage; "
            f"start the engine with the DAS speculative config (`das-trl serve`)."
        )
    return drafting


class LocalDASEngine(DASEngine):
    """A ``vllm.LLM`` in this process (TRL colocate mode, tests, benchmarks)."""

    name = "in-process vLLM engine"

    def __init__(self, llm: Any):
        self.llm = llm

    def rpc(self, method: str, *args: str, timeout: float | None = None) -> list[Any]:
        try:
            return list(self.llm.collective_rpc(method, timeout=timeout, args=tuple(args)))
        except AttributeError as exc:
            raise DASEngineError(
                f"{self.name}: worker has no method {method!r}: start the engine with the DAS worker extension "
                f"(das_trl.vllm.engine.das_engine_kwargs()): {exc}"
            ) from exc

    def reload_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load training weights in place through vLLM's ``reload_weights`` (redoes the CPU build's weight
        repacking, which TRL's direct ``load_weights`` push skips). Tensors are passed by reference, so the engine
        must live in this process (TRL colocate mode: ``external_launcher``, or ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

        Raises:
            DASEngineError: a worker failed to load the weights.
        """
        result = self.llm.collective_rpc("das_reload_weights", kwargs={"weights_iterator": list(named_tensors)})
        for reply in result:
            if not reply.get("ok"):
                raise DASEngineError(f"{self.name}: {reply.get('error')}")
        self.llm.reset_prefix_cache()


#: What :meth:`HTTPDASEngine._post` returns for a route the server does not have (``missing_ok``).
_MISSING = object()


class HTTPDASEngine(DASEngine):
    """A vLLM OpenAI server started with ``VLLM_SERVER_DEV_MODE=1`` and the DAS worker extension
    (``das-trl serve`` does both).

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"``.
        timeout: seconds per HTTP call.
    """

    def __init__(self, base_url: str, timeout: float = 300.0):
        import requests

        self.base_url = base_url.rstrip("/")
        self.name = f"vLLM server at {self.base_url}"
        self.timeout = timeout
        self._session = requests.Session()
        # Whether the server has das-trl's all-engines route (POST /das/collective_rpc); None: not asked yet.
        self._all_engines_route: bool | None = None
        self._data_parallel_size: int | None = None  # the server's, once known

    def _post(self, path: str, body: dict[str, Any] | None = None, missing_ok: bool = False) -> Any:
        """POST ``body`` as JSON to ``path``; returns the decoded reply (``None`` for an empty one).

        Args:
            missing_ok: return :data:`_MISSING` on 404 instead of raising (a route the server may not have).

        Raises:
            DASEngineError: unreachable, timed out, no such endpoint (not dev mode), or an error status.
        """
        import requests

        try:
            response = self._session.post(f"{self.base_url}{path}", json=body, timeout=self.timeout)
        except requests.exceptions.ConnectionError as exc:
            raise DASEngineError(
                f"{self.name} cannot be reached ({exc.__class__.__name__}). Start it with `das-trl serve --model "
                f"MODEL` (or check vllm_server_base_url / vllm_server_host / vllm_server_port)."
            ) from None
        except requests.exceptions.Timeout:
            raise DASEngineError(f"{self.name} did not answer {path} within {self.timeout} s") from None
        if response.status_code == 404 and missing_ok:
            return _MISSING
        if response.status_code == 404:
            raise NotDASEngineError(f"{self.name} has no {path} endpoint: it was not started in dev mode. "
                                    f"{self.working_commands()}")
        if response.status_code != 200:
            text = response.text[:500]
            # vLLM 0.32 words a missing worker method either "'CPUWorker' object has no attribute 'das_attach'" or
            # "Method 'das_attach' is not implemented." (seen in CI), without an exception class name.
            missing = ("has no attribute", "AttributeError", "is not implemented")
            if "das_" in text and any(m in text for m in missing):
                raise NotDASEngineError(
                    f"{self.name} is not a DAS engine: its workers have no DAS methods (it was started without "
                    f"das-trl's worker extension and speculative config). {self.working_commands()}. Server said: "
                    f"{text[:200]}"
                )
            raise DASEngineError(f"{self.name}: {path} failed with HTTP {response.status_code}: {text}")
        return response.json() if response.content else None

    def served_model(self) -> str | None:
        """The model the server serves (``GET /v1/models``: the first model's ``root``, else its ``id``), or ``None``
        when it does not say."""
        import requests

        try:
            # A connection of its own: the server may have closed the session's after an error reply.
            response = requests.get(f"{self.base_url}/v1/models", timeout=10)
            first = response.json()["data"][0] if response.status_code == 200 else {}
            return str(first.get("root") or first.get("id")) if isinstance(first, dict) and first else None
        except (requests.exceptions.RequestException, ValueError, KeyError, IndexError, TypeError):
            return None

    def working_commands(self) -> str:
        """The commands that start a DAS server in this one's place (its model, its port): ``das-trl serve`` and the
        same server through ``trl vllm-serve`` (:func:`das_trl.vllm.serve.working_commands`)."""
        from urllib.parse import urlparse

        from das_trl.vllm.serve import working_commands

        parsed = urlparse(self.base_url)
        model = self.served_model()
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
            if model is not None:
                return working_commands(model, port, parsed.hostname or "127.0.0.1")
        except Exception:  # noqa: BLE001 - a message must not fail; the generic form below still helps
            pass
        return ("Start it with `das-trl serve --model MODEL --port PORT`, or print TRL's own command for it with "
                "`das-trl serve --print-trl-command --model MODEL --port PORT`")

    def attach(self, drafter_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """:meth:`DASEngine.attach`; a server whose workers run no DAS drafter raises :class:`NotDASEngineError`
        naming the commands that start one that does."""
        try:
            return super().attach(drafter_config)
        except NotDASEngineError:
            raise
        except DASEngineError as exc:
            if "does not run the DAS drafter" not in str(exc):
                raise
            raise NotDASEngineError(f"{exc}. {self.working_commands()}") from None

    def health(self) -> bool:
        """Whether ``GET /health`` answers 200."""
        import requests

        try:
            return self._session.get(f"{self.base_url}/health", timeout=5).status_code == 200
        except requests.exceptions.RequestException:
            return False

    def rpc(self, method: str, *args: str, timeout: float | None = None,
            kwargs: dict[str, str] | None = None) -> list[Any]:
        """Run worker method ``method`` on every worker of every engine of the server.

        ``das_*`` methods go to das-trl's ``POST /das/collective_rpc`` (:mod:`das_trl.vllm.endpoints`: every
        data-parallel engine's replies, each dict tagged ``"engine": rank``) when the server has it, else (a server
        started without das-trl's endpoint plugin) to vLLM's ``POST /collective_rpc``, which on a data-parallel
        server returns engine 0's replies only (:meth:`attach` then refuses the server).

        Args:
            args, kwargs: strings (the worker extension decodes its payloads itself).
            timeout: seconds vLLM waits for the workers (``None``: vLLM's default).

        Returns:
            the worker replies, engine by engine.

        Raises:
            DASEngineError: unreachable, not dev mode, or an unexpected reply.
        """
        body: dict[str, Any] = {"method": method, "args": list(args)}
        if kwargs:
            body["kwargs"] = dict(kwargs)
        if timeout is not None:
            body["timeout"] = timeout
        if method.startswith("das_") and self._all_engines_route is not False:
            from das_trl.vllm.endpoints import ROUTE

            reply = self._post(ROUTE, body, missing_ok=True)
            if reply is not _MISSING:
                self._all_engines_route = True
                engines = reply.get("engines") if isinstance(reply, dict) else None
                if not isinstance(engines, list) or not all(isinstance(e, list) for e in engines):
                    raise DASEngineError(f"{self.name}: unexpected {ROUTE} reply {reply!r}")
                size = reply.get("data_parallel_size")
                self._data_parallel_size = size if isinstance(size, int) and size >= 1 else len(engines)
                return [dict(r, engine=rank) if isinstance(r, dict) else r
                        for rank, replies in enumerate(engines) for r in replies]
            self._all_engines_route = False
        reply = self._post("/collective_rpc", body)
        if not isinstance(reply, dict) or "results" not in reply:
            raise DASEngineError(f"{self.name}: unexpected /collective_rpc reply {reply!r}")
        return reply["results"]

    def data_parallel_size(self) -> int:
        """The server's data-parallel size: from das-trl's route when the server has it, else from vLLM's dev-mode
        ``GET /server_info?config_format=json`` (the API server's ``parallel_config.data_parallel_size``); 1 when
        neither answers."""
        if self._data_parallel_size is None:
            import requests

            size = 1
            try:
                response = self._session.get(f"{self.base_url}/server_info", params={"config_format": "json"},
                                             timeout=self.timeout)
                if response.status_code == 200:
                    parallel = (response.json().get("vllm_config") or {}).get("parallel_config") or {}
                    size = int(parallel.get("data_parallel_size") or 1)
            except (requests.exceptions.RequestException, ValueError, AttributeError, TypeError):
                pass
            self._data_parallel_size = size
        return self._data_parallel_size

    def reload_weights_from_dir(self, weights_dir: str) -> None:
        """Reload weights in place, on every engine, from a safetensors directory the server can read (same
        machine); then reset the prefix cache (vLLM sends that to every engine).

        Raises:
            DASEngineError: a worker failed to reload (the message names it), or the server is unreachable.
        """
        results = self.rpc("das_reload_weights", kwargs={"weights_path": weights_dir})
        failed = [r for r in results if not (isinstance(r, dict) and r.get("ok"))]
        if not results or failed:
            raise DASEngineError(f"{self.name}: das_reload_weights failed: {failed or results}")
        self._post("/reset_prefix_cache")

    def reload_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Write ``named_tensors`` to a temporary safetensors file and have the server reload from it.

        The weight-transfer path for engines without NCCL (CPU): the server must share this machine's filesystem.
        """
        from safetensors.torch import save_file

        tensors = {name: t.detach().contiguous().cpu() for name, t in named_tensors}
        with tempfile.TemporaryDirectory(prefix="das-trl-weights-") as tmp:
            save_file(tensors, os.path.join(tmp, "model.safetensors"))
            os.chmod(tmp, 0o755)
            self.reload_weights_from_dir(tmp)


@dataclass
class HistoryConsistency:
    """What :func:`check_history_consistency` found.

    Attributes:
        digests: ``{"<engine name> worker <i>": digest}`` for every worker that answered.
        expected: the reference digest (the trainer's mirror), or ``None`` to compare workers among themselves.
        errors: ``{"<engine name>": message}`` for engines that could not be asked.
    """

    digests: dict[str, str] = field(default_factory=dict)
    expected: str | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def diverged(self) -> list[str]:
        """Workers whose digest differs from ``expected`` (or, without one, from the most common digest)."""
        if not self.digests:
            return []
        reference = self.expected
        if reference is None:
            values = list(self.digests.values())
            reference = max(set(values), key=values.count)
        return [name for name, digest in self.digests.items() if digest != reference]

    @property
    def consistent(self) -> bool:
        """True when every engine answered and all workers hold the same history (equal to ``expected`` if set)."""
        return not self.errors and not self.diverged

    def report(self) -> str:
        """One line for logs: ``"history consistent across N workers"`` or what diverged / failed."""
        if self.consistent:
            return f"history consistent across {len(self.digests)} worker(s) (digest {next(iter(self.digests.values()), '-')})"
        parts = []
        if self.diverged:
            parts.append("diverged: " + ", ".join(f"{n}={self.digests[n]}" for n in self.diverged))
        if self.errors:
            parts.append("unreachable: " + ", ".join(f"{n} ({e})" for n, e in self.errors.items()))
        return f"history NOT consistent (expected {self.expected or 'majority'}): " + "; ".join(parts)


def check_history_consistency(engines: Sequence[DASEngine], expected: str | None = None) -> HistoryConsistency:
    """Ask every worker of every engine for its history digest and compare.

    Args:
        engines: the engines that should hold the same history (data-parallel engines, several server URLs).
        expected: digest they should all have (e.g. ``state_digest`` of the trainer's mirror); ``None`` compares
            them with each other.

    Returns:
        :class:`HistoryConsistency`; never raises for an unreachable engine (it is listed in ``errors``).
    """
    result = HistoryConsistency(expected=expected)
    for engine in engines:
        try:
            for label, digest in engine.labelled_history_digests().items():
                result.digests[f"{engine.name} {label}"] = digest
        except DASEngineError as exc:
            result.errors[engine.name] = str(exc)
    return result
