"""Clients for engines that run DAS: the same calls over HTTP (a ``das-trl serve`` / ``vllm serve`` process) or
in-process (a ``vllm.LLM``), both through vLLM's ``collective_rpc`` and the worker extension's ``das_*`` methods.

Each engine may have several workers (tensor/pipeline parallel): an RPC returns one result per worker, and a call only
succeeds if every worker that drafts says ``ok``. Workers that do not draft (pipeline stages before the last,
tensor-parallel ranks other than 0) answer ``no_drafter`` and are skipped; at least one worker must draft. A
data-parallel server (``data_parallel_size > 1``) is refused at :meth:`DASEngine.attach`: it returns only engine 0's
replies, so the other engines' histories could not be checked.
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


class DASEngine:
    """Common client logic; subclasses provide :meth:`rpc`."""

    name = "engine"

    def rpc(self, method: str, *args: str, timeout: float | None = None) -> list[Any]:
        """Run worker method ``method`` with string ``args`` on every worker; returns one result per worker."""
        raise NotImplementedError

    def _das_call(self, method: str, *args: str, timeout: float | None = None) -> list[dict[str, Any]]:
        """Run ``method`` on every worker; returns the replies of the workers that draft, in worker order.

        Replies marked ``no_drafter`` (ranks where vLLM runs no drafter) are left out.

        Raises:
            DASEngineError: no reply, a reply that is not a dict, a drafting worker that failed, or no worker that
                drafts.
        """
        results = self.rpc(method, *args, timeout=timeout)
        if not results:
            raise DASEngineError(f"{self.name}: {method} returned no worker results")
        drafting = []
        for result in results:
            if not isinstance(result, dict):
                raise DASEngineError(f"{self.name}: {method} returned {result!r}, expected a dict: not a DAS engine?")
            if result.get("no_drafter"):
                continue
            if not result.get("ok"):
                raise DASEngineError(f"{self.name}: {method} failed: {result.get('error', result)}")
            drafting.append(result)
        if not drafting:
            raise DASEngineError(
                f"{self.name}: {method}: none of its {len(results)} workers runs a DAS drafter "
                f"({results[0].get('error')}). At least one must: vLLM builds the drafter on the last pipeline stage; "
                f"start the engine with the DAS speculative config (`das-trl serve`)."
            )
        return drafting

    def attach(self, drafter_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Attach the proposer in every drafting worker (vLLM 0.32 needs this once after start); returns the first
        drafting worker's stats.

        Raises:
            DASEngineError: the engine does not run the DAS proposer, the config is invalid, or the engine is
                data-parallel (``data_parallel_size > 1`` outside TRL's ``external_launcher`` colocate mode: only
                engine 0's replies come back, so the history check cannot see the other engines).
        """
        config_json = json.dumps(drafter_config) if drafter_config else ""
        replies = self._das_call("das_attach", config_json)
        layout = replies[0].get("parallel") or {}
        data_parallel = int(layout.get("data_parallel_size", 1))
        if data_parallel > 1 and layout.get("distributed_executor_backend") != "external_launcher":
            from das_trl.vllm.engine_check import DATA_PARALLEL_MESSAGE

            raise DASEngineError(f"{self.name}: " + DATA_PARALLEL_MESSAGE.format(
                where="data_parallel_size", value=data_parallel))
        return replies[0]["stats"]

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
        """Every drafting worker's history digest (:func:`das_trl.drafter.digest.state_digest`), worker order.

        Raises:
            DASEngineError: unreachable, or not a DAS engine.
        """
        return [str(r["digest"]) for r in self._das_call("das_history_digest")]

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

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
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
        if response.status_code == 404:
            raise DASEngineError(
                f"{self.name} has no {path} endpoint: it was not started in dev mode. Start it with `das-trl serve` "
                f"(or set VLLM_SERVER_DEV_MODE=1 and pass the DAS speculative config and worker extension)."
            )
        if response.status_code != 200:
            text = response.text[:500]
            # vLLM 0.32 words a missing worker method either "'CPUWorker' object has no attribute 'das_attach'" or
            # "Method 'das_attach' is not implemented." (seen in CI), without an exception class name.
            missing = ("has no attribute", "AttributeError", "is not implemented")
            if "das_" in text and any(m in text for m in missing):
                raise DASEngineError(
                    f"{self.name} is not a DAS engine: its workers have no DAS methods. Start it with `das-trl "
                    f"serve` (--worker-extension-cls {__package__}.worker_extension.DASWorkerExtension). "
                    f"Server said: {text[:200]}"
                )
            raise DASEngineError(f"{self.name}: {path} failed with HTTP {response.status_code}: {text}")
        return response.json() if response.content else None

    def health(self) -> bool:
        """Whether ``GET /health`` answers 200."""
        import requests

        try:
            return self._session.get(f"{self.base_url}/health", timeout=5).status_code == 200
        except requests.exceptions.RequestException:
            return False

    def rpc(self, method: str, *args: str, timeout: float | None = None) -> list[Any]:
        body: dict[str, Any] = {"method": method, "args": list(args)}
        if timeout is not None:
            body["timeout"] = timeout
        reply = self._post("/collective_rpc", body)
        if not isinstance(reply, dict) or "results" not in reply:
            raise DASEngineError(f"{self.name}: unexpected /collective_rpc reply {reply!r}")
        return reply["results"]

    def reload_weights_from_dir(self, weights_dir: str) -> None:
        """Reload weights in place from a safetensors directory the server can read (same machine)."""
        self._das_call_kwargs("das_reload_weights", {"weights_path": weights_dir})
        self._post("/reset_prefix_cache")

    def _das_call_kwargs(self, method: str, kwargs: dict[str, str]) -> list[dict[str, Any]]:
        reply = self._post("/collective_rpc", {"method": method, "args": [], "kwargs": kwargs})
        results = reply.get("results") if isinstance(reply, dict) else None
        if not results or not all(isinstance(r, dict) and r.get("ok") for r in results):
            raise DASEngineError(f"{self.name}: {method} failed: {results or reply}")
        return results

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
            for i, digest in enumerate(engine.history_digests()):
                result.digests[f"{engine.name} worker {i}"] = digest
        except DASEngineError as exc:
            result.errors[engine.name] = str(exc)
    return result
