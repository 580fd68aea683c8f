"""``DASGRPOConfig``: TRL's ``GRPOConfig`` plus the ``das_*`` fields.

A plain ``GRPOConfig`` works with :class:`~das_trl.trainer.DASGRPOTrainer` too; :func:`das_settings` reads the
``das_*`` fields with these defaults when they are absent.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

from trl import GRPOConfig

from das_trl.budget import LENGTH_POLICY_REMOVED, ControllerConfig
from das_trl.drafter.config import NATIVE_MAX_TREE_DEPTH, DrafterConfig
from das_trl.vllm.engine import DEFAULT_NUM_SPECULATIVE_TOKENS, check_num_speculative_tokens
from das_trl.vllm.engine_check import check_engine_settings

_WEIGHT_SYNC_MODES = ("auto", "nccl", "inplace", "reload")


def _drafter_default(name: str) -> Any:
    """The drafter's own default of a setting the trainer exposes (one source: what the replay suite's default
    ``das+controller`` runs is what the trainer runs)."""
    return DrafterConfig.__dataclass_fields__[name].default

#: Environment variable with a JSON object used as ``das_vllm_kwargs`` when the config leaves it unset (e.g. to run an
#: unchanged script on a CPU machine: ``DAS_TRL_VLLM_KWARGS='{"enforce_eager": true}'``).
VLLM_KWARGS_ENV = "DAS_TRL_VLLM_KWARGS"


@dataclass
class DASGRPOConfig(GRPOConfig):
    """GRPO configuration with DAS speculative rollouts. Every ``das_*`` field is documented in its ``help``."""

    das_enabled: bool = field(
        default=True,
        metadata={"help": "Generate rollouts with the DAS drafter. False runs the same vLLM engine without "
                          "speculation (for A/B runs)."},
    )
    das_num_speculative_tokens: int = field(
        default=DEFAULT_NUM_SPECULATIVE_TOKENS,
        metadata={"help": "K: most draft tokens per request per verification round (vLLM num_speculative_tokens), "
                          "1 to 64 (the native drafter core's cap; vLLM's own is 128). The budget controller decides "
                          "per row and step how many of them to verify: long drafts for the rows that set the "
                          "makespan where they hold, none where they do not pay. The colocated engine gets K tokens "
                          "of model length past vllm_max_model_length and a max_num_batched_tokens that fits K "
                          "(docs/gpu.md)."},
    )
    das_window: int = field(
        default=_drafter_default("window"),
        metadata={"help": "History window: completions of the last W appearances of each problem are kept "
                          "(the sliding window tracks policy drift; DAS paper Sec. 4.1)."},
    )
    das_history_token_budget: int = field(
        default=8_000_000,
        metadata={"help": "Total completion tokens kept in the history across all problems; the oldest "
                          "appearances are evicted first. The engine's drafter (the native core, tree depth 64) "
                          "holds about 0.1-0.17 KB of RAM per history token (measured on recorded rollouts: "
                          "docs/tuning.md; `das-trl bench history-memory --rollouts FILE` measures yours), so the "
                          "default 8M is about 1.3 GiB at most; size it to the engine host."},
    )
    das_live_token_budget: int = field(
        default=2_000_000,
        metadata={"help": "Tokens (prompt tail + output) that finished requests' outputs may hold in the engine's "
                          "live sibling/batch trees until their problem's next history push; when, after a request "
                          "stops, they hold more, the oldest are dropped down to half of it (running requests never "
                          "are). "
                          "About 0.43 KB of engine RAM per token at most (the sibling and the batch automaton, "
                          "random tokens; measured, docs/reliability.md), so the default 2M is about 0.9 GB at "
                          "most."},
    )
    das_max_spec_factor: float = field(
        default=_drafter_default("max_spec_factor"),
        metadata={"help": "A draft is at most this factor times the length of the matched suffix (arctic's "
                          "max_spec_factor): short matches give short drafts."},
    )
    das_min_token_prob: float = field(
        default=_drafter_default("min_token_prob"),
        metadata={"help": "Stop a draft at the first token whose estimated acceptance probability (evidence-"
                          "weighted, calibrated by verification outcomes) falls below this."},
    )
    das_max_tree_depth: int | None = field(
        default=None,
        metadata={"help": "Depth of the drafter's suffix trees (tokens); None keeps the engine's drafter setting (64, "
                          "or what `das-trl serve --drafter-config` set). A tree path holds the matched suffix and "
                          "the draft, so a draft is at most this minus the match length. Deeper trees allow longer "
                          "drafts after long matches and cost more engine RAM and drafting CPU per history token (96 "
                          "measured no faster than 64 on the replay suite; docs/tuning.md#depth)."},
    )
    das_calibrate_acceptance: bool = field(
        default=True,
        metadata={"help": "Learn, from every verified draft, how often each source's drafts are really accepted "
                          "(per source, match length, draft position and estimate) and correct the drafter's "
                          "estimates with it: fewer wasted verification tokens, longer drafts where they pay "
                          "(docs/concepts.md)."},
    )
    das_budget_controller: dict | str | None = field(
        default=None,
        metadata={"help": "Per-step draft budgets from the batch budget controller (das_trl.budget), the one budget "
                          "path. Each engine step it first plans which requests can pay for a draft at all (who is "
                          "likely to finish last, from the problem's windowed history lengths; each request's own "
                          "recent acceptance; the proposer's CPU per drafted row, draft_row_us, since vLLM runs it on "
                          "the engine's critical path), drafts only those up to das_num_speculative_tokens, then keeps "
                          "the draft tokens whose expected saving pays for their verification under the cost model "
                          "c_base + c_tok * tokens per forward pass + c_logprob per row of vLLM's verification "
                          "logprob path (the verified positions with das-trl's logprob patch; rows x (longest draft "
                          "+ 1) on vLLM's own path, where a long draft in a large batch rarely pays). A step where "
                          "nothing pays drafts nothing and costs the engine almost nothing. A dict (or JSON) of "
                          "das_trl.budget.ControllerConfig fields, e.g. {\"c_base_ms\": 7.0, "
                          "\"c_tok_ms\": 0.025, \"draft_row_us\": 20.0}. None uses the defaults: 7 ms + 0.025 "
                          "ms/token (the DAS paper's GPU figures; measure your device with `das-trl bench "
                          "cost-profile`) and c_logprob_ms 0.001 per row at a 151,936-entry vocabulary, scaled to "
                          "the model's (an H200 measured 0.98 us per row with vLLM's compiled rank count; "
                          "recipes/gpu/verification_cost.py measures yours). "
                          "{\"cost_source\": \"online\"} fits the cost model from the engine's "
                          "own step times instead; measured times then steer the drafts, so two runs with the same "
                          "seed no longer give the same rollouts."},
    )
    das_length_policy: dict | str | None = field(
        default=None,
        metadata={"help": "No longer supported: the earlier tier policy was removed while 0.1.0 was developed, "
                          "and setting it is an error that names das_budget_controller, the one budget path. The "
                          "paper's tiers remain as the replay baseline `das+policy`."},
    )
    das_weight_sync: str = field(
        default="auto",
        metadata={"help": "How policy weights reach the engine each step: 'nccl' (TRL's server-mode transfer, "
                          "CUDA only), 'inplace' (TRL's colocate load_weights), 'reload' (vLLM's reload_weights, "
                          "which redoes the CPU build's weight repacking; over HTTP via a safetensors file on this "
                          "machine). 'auto' picks reload on CPU builds and TRL's own path elsewhere."},
    )
    das_vllm_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for the colocated vllm.LLM (a dict, or JSON on the command line), "
                          "e.g. {\"kv_cache_memory_bytes\": 1073741824, \"enforce_eager\": true}. They override "
                          "the arguments TRL and das-trl pass (max_num_batched_tokens, max_model_len, max_num_seqs, "
                          "gpu_memory_utilization, seed, ...), except model, tensor_parallel_size and "
                          "distributed_executor_backend, which colocate mode owns. das-trl's defaults: max_model_len "
                          "= vllm_max_model_length + das_num_speculative_tokens (vLLM skips the drafter for the whole "
                          "batch when any request is within K tokens of it) and max_num_batched_tokens = max_num_seqs "
                          "x (K + 1) within 8192..16384 on GPUs (at least 4096 on CPU builds; docs/gpu.md). On CPU "
                          "builds an explicit kv_cache_memory_bytes is the reliable way to size the KV cache. When "
                          "unset, the DAS_TRL_VLLM_KWARGS environment variable (JSON) is used if present."},
    )
    das_record_rollouts: str | None = field(
        default=None,
        metadata={"help": "Path of a JSONL file to append every training step's rollouts to (format: "
                          "das_trl.drafter.rollout_log), the input of `das-trl bench replay`. None records nothing."},
    )
    das_check_engine: bool = field(
        default=True,
        metadata={"help": "At trainer start, verify the engine runs the DAS drafter and fail with a clear message "
                          "if it does not."},
    )

    def __post_init__(self):
        super().__post_init__()
        validate_das_settings(das_settings(self))


def das_settings(args: Any) -> dict[str, Any]:
    """The ``das_*`` settings of ``args`` (a ``DASGRPOConfig`` or any ``GRPOConfig``), defaults filled in.

    An unset ``das_vllm_kwargs`` takes the JSON text of ``$DAS_TRL_VLLM_KWARGS`` when that is set (parsed by
    :func:`validate_das_settings`).

    Returns:
        ``dict`` keyed by field name without the ``das_`` prefix (``"window"``, ``"weight_sync"``, ...).
    """
    out = {}
    for f in fields(DASGRPOConfig):
        if f.name.startswith("das_"):
            out[f.name[4:]] = getattr(args, f.name, f.default)
    if out["vllm_kwargs"] is None and os.environ.get(VLLM_KWARGS_ENV):
        out["vllm_kwargs"] = os.environ[VLLM_KWARGS_ENV]  # JSON text: validate_das_settings parses it
    return out


def validate_das_settings(settings: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the ``das_*`` setting for a value of the wrong type (``"8"``, ``2.5`` for an int,
    ``"no"`` for a bool), not finite, or out of range, when the config is built: the drafter's fields are checked by
    building the :class:`~das_trl.drafter.DrafterConfig` the engine would get, so a value cannot pass here and fail
    at the engine's attach. Parses the ``vllm_kwargs`` / ``budget_controller`` JSON in place, and refuses engine
    arguments that cannot run the drafter (``das_vllm_kwargs["async_scheduling"]`` true while DAS is enabled)."""
    # K: vLLM verifies at most 128 draft tokens per request, the native core drafts at most 64.
    check_num_speculative_tokens(settings["num_speculative_tokens"], "das_num_speculative_tokens")
    for name in ("enabled", "check_engine"):  # "no" would read as true; the drafter checks its own bools below
        if not isinstance(settings.get(name, True), bool):
            raise ValueError(f"das_{name} must be true or false, got {settings[name]!r}")
    record = settings.get("record_rollouts")
    if record is not None and (not isinstance(record, (str, os.PathLike)) or not str(record).strip()):
        raise ValueError(f"das_record_rollouts must be None or a file path, got {record!r}")
    depth = settings.get("max_tree_depth")
    if depth is not None:
        low = _drafter_default("support_ngram")  # the drafter counts support over n-grams within one tree path
        if not isinstance(depth, int) or isinstance(depth, bool) or not low <= depth <= NATIVE_MAX_TREE_DEPTH:
            # checked here, not first in the engine at attach
            raise ValueError(f"das_max_tree_depth must be None or an int in [{low}, {NATIVE_MAX_TREE_DEPTH}] "
                             f"(tokens), got {depth!r}")
    _validate_config_dict(settings, "budget_controller", ControllerConfig)
    # The drafter's own checks (types, nan, ranges), here rather than first at the engine's attach, once loaded.
    try:
        DrafterConfig(**{k: v for k, v in drafter_config_fields(settings).items()
                         if k in DrafterConfig.__dataclass_fields__})  # budget_controller: checked above
    except (TypeError, ValueError) as exc:
        raise ValueError(_as_das_setting(str(exc))) from None
    if isinstance(settings["vllm_kwargs"], str):
        try:
            settings["vllm_kwargs"] = json.loads(settings["vllm_kwargs"])
        except json.JSONDecodeError as exc:
            source = f" (from ${VLLM_KWARGS_ENV})" if settings["vllm_kwargs"] == os.environ.get(VLLM_KWARGS_ENV) else ""
            raise ValueError(f"das_vllm_kwargs{source} is not valid JSON: {exc}") from None
    if settings["vllm_kwargs"] is not None and not isinstance(settings["vllm_kwargs"], dict):
        raise ValueError(f"das_vllm_kwargs must be a dict, got {type(settings['vllm_kwargs']).__name__}")
    if settings["enabled"]:
        check_engine_settings(settings["vllm_kwargs"], environ={})  # async_scheduling cannot run the drafter
    if settings.get("length_policy") is not None:
        raise ValueError(LENGTH_POLICY_REMOVED)
    if settings["weight_sync"] not in _WEIGHT_SYNC_MODES:
        raise ValueError(f"das_weight_sync must be one of {_WEIGHT_SYNC_MODES}, got {settings['weight_sync']!r}")


def _as_das_setting(message: str) -> str:
    """``DrafterConfig: window must be ...`` -> ``das_window must be ...`` (the name the user set)."""
    field_name, _, rest = message.removeprefix("DrafterConfig: ").partition(" ")
    das_name = "das_num_speculative_tokens" if field_name == "max_spec_tokens" else f"das_{field_name}"
    known = das_name in {f.name for f in fields(DASGRPOConfig)}
    return f"{das_name} {rest}" if known else message


def _validate_config_dict(settings: dict[str, Any], key: str, config_cls: type) -> None:
    """Parse ``settings[key]`` from JSON in place when it is a string and check it builds ``config_cls``.

    Raises:
        ValueError: invalid JSON, not a dict, or fields ``config_cls`` rejects (the message names ``das_<key>``).
    """
    value = settings.get(key)
    if isinstance(value, str):
        try:
            value = settings[key] = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"das_{key} is not valid JSON: {exc}") from None
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"das_{key} must be a dict, got {type(value).__name__}")
    try:
        config_cls(**value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"das_{key}: {exc}") from None


def drafter_config_fields(settings: dict[str, Any]) -> dict[str, Any]:
    """The :class:`~das_trl.drafter.DrafterConfig` fields these settings set (sent with ``das_attach``)."""
    return {
        "window": settings["window"],
        "history_token_budget": settings["history_token_budget"],
        "live_token_budget": settings["live_token_budget"],
        "max_spec_tokens": settings["num_speculative_tokens"],
        "max_spec_factor": settings["max_spec_factor"],
        "min_token_prob": settings["min_token_prob"],
        "calibrate_acceptance": settings["calibrate_acceptance"],
        "budget_controller": settings.get("budget_controller") or {},
        # only when set: None keeps the engine's own (a server's --drafter-config included)
        **({"max_tree_depth": settings["max_tree_depth"]} if settings.get("max_tree_depth") is not None else {}),
    }
