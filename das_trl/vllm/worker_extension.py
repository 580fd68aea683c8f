"""Worker extension: the RPCs through which trainers and tools reach the DAS proposer inside vLLM's workers.

Enabled with ``worker_extension_cls="das_trl.vllm.worker_extension.DASWorkerExtension"`` (CLI
``--worker-extension-cls``); vLLM mixes this class into every worker. Call the methods with
``LLM.collective_rpc(name, args=...)`` in-process, or over HTTP on a dev-mode server (``VLLM_SERVER_DEV_MODE=1``) with
``POST /collective_rpc {"method": name, "args": [...]}``; see :mod:`das_trl.vllm.client`. Every argument is a string
and every result a JSON-able ``dict``, so both routes behave the same.

No method raises for bad input: a failure comes back as ``{"ok": False, "error": "..."}`` and the engine keeps serving
with its history unchanged. Workers of a DAS engine that do not draft (pipeline stages before the last, tensor-parallel
ranks other than 0: :func:`rank_without_drafter`) answer the drafter methods with ``{"ok": False, "no_drafter": True,
"error": "no drafter on this rank (...)"}``; clients skip those replies.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

from das_trl.drafter import DrafterConfig
from das_trl.budget import LENGTH_POLICY_REMOVED, ControllerConfig
from das_trl.drafter.digest import state_digest
from das_trl.vllm.payload import DEFAULT_MAX_PAYLOAD_BYTES, PayloadError, decode_history_state, decode_rollouts
from das_trl.vllm.proposer import DASProposer

logger = logging.getLogger(__name__)

# The fully qualified names users pass to vLLM.
PROPOSER_QUALNAME = "das_trl.vllm.proposer.DASProposer"
WORKER_EXTENSION_QUALNAME = "das_trl.vllm.worker_extension.DASWorkerExtension"


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def payload_limit(max_payload_bytes: str = "") -> int:
    """The payload size limit in bytes: ``max_payload_bytes`` (decimal string), else the environment variable
    ``DAS_TRL_MAX_PAYLOAD_BYTES``, else ``DEFAULT_MAX_PAYLOAD_BYTES`` (256 MiB).

    Raises:
        PayloadError: the limit is not a positive decimal integer.
    """
    text = str(max_payload_bytes or os.environ.get("DAS_TRL_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES))
    try:
        limit = int(text)
    except ValueError:
        raise PayloadError(f"max_payload_bytes must be a decimal integer, got {text!r}") from None
    if limit < 1:
        raise PayloadError(f"max_payload_bytes must be >= 1, got {limit}")
    return limit


def _safetensors_dir(path: str) -> bool:
    try:
        return os.path.isdir(path) and any(name.endswith(".safetensors") for name in os.listdir(path))
    except OSError:
        return False


def _runs_das(vllm_config: Any) -> bool:
    """Whether the engine was started with the DAS proposer (``speculative_config`` method ``custom_class``, model
    :data:`PROPOSER_QUALNAME`)."""
    spec = getattr(vllm_config, "speculative_config", None)
    return getattr(spec, "method", None) == "custom_class" and getattr(spec, "model", None) == PROPOSER_QUALNAME


def _group_ranks() -> tuple[int, int]:
    """This worker's rank in its tensor-parallel and prefill-context-parallel groups (vLLM's ``parallel_state``).

    Raises:
        AssertionError, ImportError: vLLM's groups are not initialised (outside a worker).
    """
    from vllm.distributed import parallel_state

    tp_rank = parallel_state.get_tp_group().rank_in_group
    get_pcp_group = getattr(parallel_state, "get_pcp_group", None)
    pcp_rank = get_pcp_group().rank_in_group if get_pcp_group is not None else 0
    return tp_rank, pcp_rank


def drafting_rank(vllm_config: Any) -> bool:
    """Whether vLLM uses the drafts proposed on this worker.

    vLLM 0.32 and 0.33 (``MultiprocExecutor.take_draft_token_ids``: ``unique_reply_rank=output_rank``, the first
    tensor-parallel worker of the last pipeline stage; the uniprocess executor's single worker; Ray's worker 0)
    schedule the drafts of one rank only and hand them to every rank with the next step, so drafting on the other
    tensor-parallel ranks would only cost CPU time and a copy of the history each. With the ``external_launcher``
    backend (TRL's colocate mode) every process schedules its own steps from its own drafts: every rank drafts.

    Args:
        vllm_config: the worker's ``VllmConfig`` (``parallel_config`` read; ``None`` or no parallel config: True).

    Returns:
        True on the drafting rank (and whenever the ranks cannot be told apart).
    """
    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is None or getattr(parallel, "distributed_executor_backend", None) == "external_launcher":
        return True
    if int(getattr(parallel, "tensor_parallel_size", 1)) * int(getattr(parallel, "prefill_context_parallel_size",
                                                                       1)) <= 1:
        return True
    try:
        tp_rank, pcp_rank = _group_ranks()
    except (AssertionError, ImportError, AttributeError):
        return True
    return tp_rank == 0 and pcp_rank == 0


def rank_without_drafter(vllm_config: Any, drafter: Any) -> str | None:
    """Why this worker of a DAS engine has no drafter to serve ``das_*`` calls, or ``None`` if that is not the case.

    Args:
        vllm_config: the worker's ``VllmConfig``.
        drafter: the worker's ``model_runner.drafter`` (``None`` when vLLM built none here).

    Returns:
        ``"pipeline stage before the last"`` (vLLM builds the drafter on the last pipeline stage only),
        ``"tensor-parallel rank other than 0"`` (see :func:`drafting_rank`), or ``None``: the engine does not run DAS,
        or this worker should have an active drafter.
    """
    if not _runs_das(vllm_config):
        return None
    if not isinstance(drafter, DASProposer):
        pipeline = int(getattr(getattr(vllm_config, "parallel_config", None), "pipeline_parallel_size", 1))
        return "pipeline stage before the last: vLLM builds the drafter on the last stage only" if pipeline > 1 else None
    if not drafting_rank(vllm_config):
        return "tensor-parallel rank other than 0: vLLM uses the drafts of tensor-parallel rank 0 only"
    return None


def parallel_layout(vllm_config: Any) -> dict[str, Any]:
    """The engine's parallel sizes as a worker sees them (sent with ``das_attach``'s reply).

    Returns:
        ``{"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_index": int,
        "distributed_executor_backend": str | None}`` (sizes 1 where the config has no parallel section). The engines
        of a data-parallel server of a dense (non-MoE) model each report ``data_parallel_size`` 1: vLLM runs them as
        independent replicas (``ParallelConfig.reconfigure_for_independent_dp_rank``, vLLM 0.32); their
        ``data_parallel_index`` keeps the engine's rank.
    """
    parallel = getattr(vllm_config, "parallel_config", None)
    backend = getattr(parallel, "distributed_executor_backend", None)
    return {
        "tensor_parallel_size": int(getattr(parallel, "tensor_parallel_size", 1)),
        "pipeline_parallel_size": int(getattr(parallel, "pipeline_parallel_size", 1)),
        "data_parallel_size": int(getattr(parallel, "data_parallel_size", 1)),
        "data_parallel_index": int(getattr(parallel, "data_parallel_index", 0) or 0),
        "distributed_executor_backend": backend if backend is None or isinstance(backend, str) else str(backend),
    }


def engine_limits(vllm_config: Any) -> dict[str, Any]:
    """The engine sizes a trainer checks its rollouts against (sent with ``das_attach``'s reply).

    Returns:
        ``{"max_model_len": int | None, "max_num_batched_tokens": int | None, "num_speculative_tokens": int | None}``
        (``None`` where the config has no such field): the model length (tokens per sequence, prompt + output), the
        scheduler's tokens per engine step (draft tokens count against it) and K.
    """
    def read(section: str, name: str) -> int | None:
        value = getattr(getattr(vllm_config, section, None), name, None)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return {
        "max_model_len": read("model_config", "max_model_len"),
        "max_num_batched_tokens": read("scheduler_config", "max_num_batched_tokens"),
        "num_speculative_tokens": read("speculative_config", "num_speculative_tokens"),
    }


def attach_configs(fields: object, base: DrafterConfig | None = None) -> tuple[DrafterConfig, ControllerConfig | None]:
    """The drafter and controller configs of a ``das_attach`` config object (also checked by ``das-trl serve`` before
    it starts the server, so a typo fails in a second rather than after the engine's start-up).

    Args:
        fields: the decoded JSON: :class:`~das_trl.drafter.DrafterConfig` fields overriding ``base``, optionally with
            ``"budget_controller"``, an object of :class:`~das_trl.budget.config.ControllerConfig` fields.
        base: the config the fields override (default: ``DrafterConfig()``).

    Returns:
        ``(DrafterConfig, ControllerConfig or None)``; ``None``: no ``"budget_controller"`` given.

    Raises:
        ValueError: not an object, ``"length_policy"`` (removed), or a field value the configs reject.
        TypeError: an unknown field.
    """
    if not isinstance(fields, dict):
        raise ValueError(f"expected a JSON object of DrafterConfig fields, got {type(fields).__name__}")
    fields = dict(fields)
    if fields.pop("length_policy", None) is not None:
        raise ValueError(LENGTH_POLICY_REMOVED)
    controller = None
    controller_fields = fields.pop("budget_controller", None)
    if controller_fields is not None:
        if not isinstance(controller_fields, dict):
            raise ValueError("budget_controller must be a JSON object of ControllerConfig fields")
        controller = ControllerConfig(**controller_fields)
    base = base if base is not None else DrafterConfig()
    merged = dataclasses.asdict(base) | fields
    if "max_tree_depth" in fields and "match_context_tokens" not in fields \
            and base.match_context_tokens == min(32, base.max_tree_depth):
        # the base's matched tail was derived from its depth (min(32, depth)): derive it again from the new depth,
        # so a depth below 32 is not refused for a tail nobody set
        merged["match_context_tokens"] = None
    return DrafterConfig(**merged), controller

class DASWorkerExtension:
    """Methods added to each vLLM worker (``self`` is the worker; ``self.model_runner`` its model runner)."""

    # vLLM >= 0.33 calls this once the worker has its model runner; on 0.32 clients call das_attach themselves.
    def init_worker_extension(self) -> None:
        """Attach the proposer as soon as the worker has a model runner (vLLM >= 0.33 hook); drafting rank only."""
        if self._das_proposer() is not None:
            self.das_attach()

    def _das_proposer(self) -> DASProposer | None:
        """This worker's DAS proposer, or ``None`` when it has none or is not the rank whose drafts vLLM uses."""
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        if not isinstance(drafter, DASProposer):
            return None
        return drafter if drafting_rank(getattr(self, "vllm_config", None)) else None

    def _das_missing(self, message: str) -> dict[str, Any]:
        """The reply of a ``das_*`` method on a worker without an active DAS proposer.

        Ranks of a DAS engine that do not draft (pipeline stages before the last, tensor-parallel ranks other than 0)
        answer ``{"ok": False, "no_drafter": True, "error": "no drafter on this rank (...)"}``, which clients skip;
        any other worker answers ``{"ok": False, "error": message}``.
        """
        reason = rank_without_drafter(getattr(self, "vllm_config", None),
                                      getattr(getattr(self, "model_runner", None), "drafter", None))
        if reason is not None:
            return {"ok": False, "no_drafter": True, "error": f"no drafter on this rank ({reason})"}
        return _error(message)

    def das_attach(self, config_json: str = "") -> dict[str, Any]:
        """Hand the DAS proposer its model runner so it can tell requests apart, optionally reconfiguring it.

        Args:
            config_json: JSON object of :class:`~das_trl.drafter.DrafterConfig` fields ("" keeps the current config),
                optionally with ``"budget_controller"``: an object of
                :class:`~das_trl.budget.config.ControllerConfig` fields. ``"length_policy"`` (the earlier
                tier policy) is refused with a message naming ``budget_controller``.

        Returns:
            ``{"ok": True, "stats": {...}, "parallel": {...}, "limits": {...}}`` (:func:`parallel_layout`,
            :func:`engine_limits`), or ``{"ok": False, "error": ...}`` when the engine was not started with
            the DAS proposer (``speculative_config`` method ``custom_class`` and model ``PROPOSER_QUALNAME``) or the
            config is invalid.
        """
        proposer = self._das_proposer()
        if proposer is None:
            spec = getattr(getattr(self, "vllm_config", None), "speculative_config", None)
            return self._das_missing(
                f"this engine does not run the DAS drafter (speculative_config={spec!r}); start it with "
                f"speculative_config={{'method': 'custom_class', 'model': '{PROPOSER_QUALNAME}', ...}}"
            )
        config = controller = None
        if config_json:
            try:
                config, controller = attach_configs(json.loads(config_json), proposer.drafter.config)
            except (ValueError, TypeError) as exc:
                return _error(f"invalid drafter config {config_json!r}: {exc}")
        try:
            proposer.attach(self.model_runner, config, controller)
        except (ValueError, TypeError) as exc:
            return _error(str(exc))
        return {"ok": True, "stats": proposer.stats(), "parallel": parallel_layout(self.vllm_config),
                "limits": engine_limits(self.vllm_config)}

    def das_reload_weights(self, weights_path: str = "", weights_iterator: Any = None) -> dict[str, Any]:
        """Reload the model's weights in place (vLLM's ``reload_weights``), keeping tied embeddings tied.

        vLLM's layerwise in-place reload gives ``embed_tokens`` a new parameter, leaving a tied ``lm_head`` on the old
        one (seen on vLLM 0.32 CPU with SmolLM2: logits stayed those of the old embedding, 0.57-nat logprob errors).
        After the reload the head is re-tied and re-processed (the CPU build prepacks its GEMM weights).

        Args:
            weights_path: directory with safetensors files (HTTP route: the server must see the trainer's files).
            weights_iterator: in-process only: ``(name, torch.Tensor)`` pairs in checkpoint format.

        Returns:
            ``{"ok": True, "seconds": float, "retied_lm_head": bool}`` or ``{"ok": False, "error": ...}``.
        """
        if not weights_path and weights_iterator is None:
            return _error("das_reload_weights needs weights_path or weights_iterator")
        if weights_path and not _safetensors_dir(weights_path):
            # Only safetensors: a directory of pickled checkpoints (.bin/.pt) would be unpickled by the loader.
            return _error(f"das_reload_weights: {weights_path!r} is not a directory of .safetensors files")
        started = time.perf_counter()
        try:
            if weights_iterator is not None:
                self.reload_weights(weights_iterator=weights_iterator)
            else:
                self.reload_weights(weights_path=weights_path)
        except Exception as exc:  # noqa: BLE001 - report any loader failure to the caller, keep serving
            logger.exception("weight reload failed")
            return _error(f"weight reload failed: {type(exc).__name__}: {exc}")
        return {"ok": True, "seconds": time.perf_counter() - started, "retied_lm_head": self._das_retie_lm_head()}

    def _das_retie_lm_head(self) -> bool:
        """Re-tie a tied ``lm_head`` to the reloaded embeddings and redo its post-load processing."""
        model = self.model_runner.model
        hf_config = self.vllm_config.model_config.hf_config
        get_text_config = getattr(hf_config, "get_text_config", None)
        text_config = get_text_config() if callable(get_text_config) else hf_config
        if not getattr(text_config, "tie_word_embeddings", False):
            return False
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if lm_head is None or embed is None:
            return False
        if lm_head.weight is not embed.weight:
            lm_head.weight = embed.weight
        # The checkpoint has no lm_head tensor, so the reload never re-processed the head: on CPU builds its
        # prepacked GEMM weights still hold the old embedding.
        quant_method = getattr(lm_head, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(lm_head)
        return True

    def das_detach(self) -> dict[str, Any]:
        """Stop drafting (the engine keeps serving without speculation proposals); history is kept."""
        proposer = self._das_proposer()
        if proposer is None:
            return self._das_missing("this engine does not run the DAS drafter")
        proposer.detach()
        return {"ok": True, "stats": proposer.stats()}

    def das_add_history(self, payload: str, max_payload_bytes: str = "") -> dict[str, Any]:
        """Add one step's rollouts (a payload from :func:`~das_trl.vllm.payload.encode_rollouts`) to the history.

        Args:
            payload: base64 history payload.
            max_payload_bytes: optional limit as a decimal string (default ``DAS_TRL_MAX_PAYLOAD_BYTES`` or 256 MiB).

        Returns:
            ``{"ok": True, "added": {...}, "seconds": float, "stats": {...}}`` or ``{"ok": False, "error": ...}``; a
            rejected payload changes nothing.
        """
        proposer = self._das_proposer()
        if proposer is None:
            return self._das_missing("this engine does not run the DAS drafter: nothing to add history to")
        started = time.perf_counter()
        try:
            limit = payload_limit(max_payload_bytes)
            rollouts = decode_rollouts(payload, vocab_size=proposer.vocab_size, max_payload_bytes=limit)
            # History now, suffix trees on the drafter's updater thread: the engine keeps generating meanwhile.
            added = proposer.add_history(rollouts.prompts, rollouts.completions, rollouts.problem_keys)
        except (PayloadError, ValueError) as exc:
            logger.warning("rejected a DAS history payload: %s", exc)
            return _error(f"rejected history payload: {exc}")
        return {"ok": True, "added": added, "seconds": time.perf_counter() - started, "stats": proposer.stats()}

    def das_history_digest(self) -> dict[str, Any]:
        """Content digest of this worker's history (:func:`das_trl.drafter.digest.state_digest`), to compare engines.

        Returns:
            ``{"ok": True, "digest": str, "stats": {...}}``. Cost: one pass over the history (it holds the drafter's
            lock meanwhile, so drafting waits; about 0.1 s per 10M history tokens).
        """
        proposer = self._das_proposer()
        if proposer is None:
            return self._das_missing("this engine does not run the DAS drafter")
        digest = state_digest(proposer.drafter.state_dict()["history"])
        return {"ok": True, "digest": digest, "stats": proposer.stats()}

    def das_load_history(self, payload: str, max_payload_bytes: str = "") -> dict[str, Any]:
        """Replace the whole history with a saved one (:func:`~das_trl.vllm.payload.encode_history_state`).

        Used to restore a checkpoint's history and to repair an engine whose history diverged. The engine's window
        and token budget apply (a smaller budget trims the oldest appearances); running requests keep drafting.

        Args:
            payload: base64 ``DASH`` payload.
            max_payload_bytes: optional limit as a decimal string (default as :meth:`das_add_history`).

        Returns:
            ``{"ok": True, "digest": str, "seconds": float, "stats": {...}}`` or ``{"ok": False, "error": ...}``; a
            rejected payload leaves the current history in place.
        """
        proposer = self._das_proposer()
        if proposer is None:
            return self._das_missing("this engine does not run the DAS drafter: nothing to load history into")
        started = time.perf_counter()
        try:
            state = decode_history_state(payload, vocab_size=proposer.vocab_size,
                                         max_payload_bytes=payload_limit(max_payload_bytes))
            proposer.load_history(state)
        except (PayloadError, ValueError, KeyError) as exc:
            logger.warning("rejected a DAS history state: %s", exc)
            return _error(f"rejected history state: {exc}")
        digest = state_digest(proposer.drafter.state_dict()["history"])
        return {"ok": True, "digest": digest, "seconds": time.perf_counter() - started, "stats": proposer.stats()}

    def das_stats(self) -> dict[str, Any]:
        """``{"ok": True, "stats": {...}}`` with :meth:`DASProposer.stats`, or an error when DAS is not running."""
        proposer = self._das_proposer()
        if proposer is None:
            return self._das_missing("this engine does not run the DAS drafter")
        return {"ok": True, "stats": proposer.stats()}

    def das_reset(self, what: str = "all") -> dict[str, Any]:
        """Reset ``"counters"``, ``"history"`` or ``"all"`` (both); returns the stats after the reset."""
        proposer = self._das_proposer()
        if proposer is None:
            return self._das_missing("this engine does not run the DAS drafter")
        if what not in ("counters", "history", "all"):
            return _error(f"das_reset: unknown target {what!r} (use 'counters', 'history' or 'all')")
        if what in ("history", "all"):
            proposer.reset_history()
        if what in ("counters", "all"):
            proposer.reset_counters()
        return {"ok": True, "stats": proposer.stats()}
