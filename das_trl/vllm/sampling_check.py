"""Sampling parameters that stop speculation from working, detected before a run instead of at its first rollout.

What vLLM 0.32 does with each parameter when a speculative proposer is configured (read in
``vllm/sampling_params.py::_validate_spec_decode``, ``v1/sample/rejection_sampler.py`` and
``v1/sample/logits_processor/__init__.py``; the ``engine`` reliability tests check the first two rows and the
penalty row on the CPU build):

=====================================  =========  ====================================================================
parameter                              severity   what happens
=====================================  =========  ====================================================================
``min_p > 0``                          error      rejected ("not yet supported with speculative decoding") by
                                                  ``SamplingParams.verify``; through ``LLM.generate`` on the CPU build
                                                  it was accepted and silently not applied
``logit_bias``                         error      same as ``min_p``
``n > 1`` with ``temperature == 0``    error      the request is rejected (greedy sampling needs ``n == 1``)
``seed`` (CPU build)                   error      per-request seeds fail on vLLM's CPU build
penalties, ``bad_words``,              note       drafts are still proposed and verified with these applied (lossless);
``allowed_token_ids``, ``min_tokens``             they reshape the target distribution, so history drafts may be
                                                  accepted less often
=====================================  =========  ====================================================================

vLLM 0.32 does not skip speculation for a single request: the parameters it cannot combine with speculation
fail the request or are dropped (min_p, logit_bias), so they are errors here, before the run. Older vLLM releases (V0 engine) skipped speculation for some of them; the table is
what this package is tested against.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_EPS = 1e-5
_NOTE_PARAMS = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@dataclass(frozen=True)
class SamplingIssue:
    """One sampling parameter that interferes with speculation.

    Attributes:
        param: the parameter's name (``str``, as in ``vllm.SamplingParams``).
        value: its value.
        severity: ``"error"`` (vLLM rejects the request, or speculation cannot run) or ``"note"`` (works, lossless,
            but drafting from history is less effective).
        message: what happens and what to do.
    """

    param: str
    value: Any
    severity: str
    message: str


def _get(params: Mapping[str, Any] | Any, name: str, default: Any = None) -> Any:
    if isinstance(params, Mapping):
        return params.get(name, default)
    return getattr(params, name, default)


def check_sampling_params(params: Mapping[str, Any] | Any, cpu_build: bool = False) -> list[SamplingIssue]:
    """Find the parameters of one request that vLLM rejects with speculation on, or that weaken drafting.

    Args:
        params: a ``vllm.SamplingParams`` or a ``dict`` of its fields (missing fields count as vLLM's defaults;
            ``None`` values too, as TRL sends them).
        cpu_build: whether the engine is vLLM's CPU build (adds its per-request ``seed`` failure).

    Returns:
        ``list[SamplingIssue]``, errors first; empty when speculation runs unhindered.
    """
    issues: list[SamplingIssue] = []
    min_p = _get(params, "min_p") or 0.0
    if min_p > _EPS:
        issues.append(SamplingIssue("min_p", min_p, "error",
                                    "vLLM rejects min_p > 0 when speculative decoding is on, or silently does not "
                                    "apply it; use top_p/top_k instead, or run without DAS"))
    logit_bias = _get(params, "logit_bias")
    if logit_bias:
        issues.append(SamplingIssue("logit_bias", logit_bias, "error",
                                    "vLLM rejects (or silently drops) logit_bias when speculative decoding is on; use bad_words or "
                                    "allowed_token_ids instead, or run without DAS"))
    n = _get(params, "n") or 1
    temperature = _get(params, "temperature")
    if n > 1 and temperature is not None and temperature < _EPS:
        issues.append(SamplingIssue("n", n, "error",
                                    f"vLLM rejects n={n} with temperature 0 (greedy sampling needs n == 1)"))
    seed = _get(params, "seed")
    if cpu_build and seed is not None:
        issues.append(SamplingIssue("seed", seed, "error",
                                    "per-request seeds fail on vLLM's CPU build; seed the engine instead"))
    for name, neutral in _NOTE_PARAMS.items():
        value = _get(params, name)
        if value is not None and abs(value - neutral) > _EPS:
            issues.append(SamplingIssue(name, value, "note",
                                        f"{name}={value}: drafts are verified with the penalty applied (lossless), "
                                        "but history drafts may be accepted less often"))
    for name in ("bad_words", "allowed_token_ids"):
        value = _get(params, name)
        if value:
            issues.append(SamplingIssue(name, value, "note",
                                        f"{name} is applied during verification (lossless); drafts containing "
                                        "excluded tokens are rejected"))
    if (_get(params, "min_tokens") or 0) > 0:
        issues.append(SamplingIssue("min_tokens", _get(params, "min_tokens"), "note",
                                    "min_tokens is applied during verification (lossless); drafts that end early "
                                    "are rejected"))
    return sorted(issues, key=lambda i: i.severity != "error")


def trl_sampling_params(args: Any) -> dict[str, Any]:
    """The per-request sampling fields TRL's ``VLLMGeneration`` (trl 1.16) sends for a ``GRPOConfig``.

    Args:
        args: a ``GRPOConfig`` (or any object with its fields).

    Returns:
        ``dict`` of ``SamplingParams`` fields: ``repetition_penalty``, ``temperature``, ``top_p``, ``top_k``,
        ``min_p``, then ``generation_kwargs`` on top (as TRL merges them).
    """
    out = {name: getattr(args, name, None)
           for name in ("repetition_penalty", "temperature", "top_p", "top_k", "min_p")}
    out.update(getattr(args, "generation_kwargs", None) or {})
    return out


def format_issues(issues: list[SamplingIssue]) -> str:
    """One line per issue: ``"<severity> <param>=<value>: <message>"``."""
    return "\n".join(f"{i.severity} {i.param}={i.value!r}: {i.message}" for i in issues)


def refuse_unsupported_sampling(args: Any, who: str, cpu_build: bool) -> None:
    """A trainer's check at construction: raise for the sampling parameters of ``args`` (:func:`trl_sampling_params`)
    that vLLM rejects with speculation on; log a warning for each one that only weakens it.

    Args:
        args: the trainer's config (a ``GRPOConfig``, an ``AsyncGRPOConfig``, or any object with those fields).
        who: the trainer's name, for the message.
        cpu_build: whether the engine is vLLM's CPU build.

    Raises:
        ValueError: one line per refused parameter (:func:`format_issues`).
    """
    issues = check_sampling_params(trl_sampling_params(args), cpu_build=cpu_build)
    errors = [i for i in issues if i.severity == "error"]
    if errors:
        raise ValueError(f"{who}: these sampling parameters cannot be used with DAS speculative rollouts:\n"
                         + format_issues(errors))
    for issue in issues:
        logger.warning("DAS sampling note: %s", format_issues([issue]))
