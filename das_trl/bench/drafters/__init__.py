"""The replay's drafters, one file each, and the registry that builds them by name.

``none`` (:mod:`.base`), ``ngram`` (:mod:`.ngram`: vLLM's prompt lookup), ``suffix`` (:mod:`.suffix`: vLLM's
``suffix`` method, arctic-inference), the DAS ablations ``das-problem`` (per-problem tree only), ``das+global`` (+
global and local trees), ``das+siblings`` (+ running siblings: the drafter as shipped), ``das+policy`` / ``das+cost``
(+ the paper's length policy, tiers / cost mode; :mod:`.das`), and ``das+controller`` (+ the batch budget controller,
the product's default; :mod:`.das_controller`). A new baseline is a :class:`Drafter` in a file of its own plus a
line in :func:`make_drafter`.
"""

from __future__ import annotations

from das_trl.budget import ControllerConfig
from das_trl.budget.tiers import LengthPolicy, LengthPolicyConfig
from das_trl.drafter import DrafterConfig as _DrafterConfig

from .base import Drafter, NoDrafter
from .das import DASReplayDrafter
from .das_controller import DASControllerDrafter
from .ngram import NgramDrafter
from .suffix import SuffixDrafter

ALL_DRAFTERS = ("none", "ngram", "suffix", "das-problem", "das+global", "das+siblings", "das+policy", "das+cost",
                "das+controller")
DEFAULT_DRAFTERS = ALL_DRAFTERS
#: Drafters whose drafts depend on the cost model (a suite re-runs them for every cost model; the others' results
#: are re-costed with ``ReplayResult.time_at``).
COST_AWARE = ("das+controller", "das+cost")

__all__ = ["ALL_DRAFTERS", "COST_AWARE", "DEFAULT_DRAFTERS", "Drafter", "controller_config", "draft_cap",
           "make_drafter"]


def make_drafter(name: str, ngram=(5, 5, 8), policy_config: LengthPolicyConfig | None = None,
                 das_overrides: dict | None = None, controller_config: ControllerConfig | None = None,
                 draft_threads: int | None = None) -> Drafter:
    """Build a replay drafter by name (one of :data:`ALL_DRAFTERS`); ``das_overrides``: DrafterConfig fields applied
    to every DAS variant (the ablation switches of a variant still win); ``controller_config``: the
    ``das+controller`` variant's settings (give it the replay's cost model); ``draft_threads``: the DAS drafter's
    drafting threads (default 1, unless ``das_overrides`` sets ``draft_threads``: one thread is what thread CPU
    time measures fully; with more, the replay times the calls by the wall clock)."""
    ov = dict(das_overrides or {})
    if draft_threads is not None:
        ov["draft_threads"] = int(draft_threads)
    ov.setdefault("draft_threads", 1)

    def DrafterConfig(**kw):  # noqa: N802 - the variant's switches over the user's overrides
        return _DrafterConfig(**{**ov, **kw})

    if name == "none":
        return NoDrafter()
    if name == "ngram":
        return NgramDrafter(*ngram)
    if name == "suffix":
        return SuffixDrafter()
    pc = policy_config or LengthPolicyConfig()
    if name == "das-problem":
        return DASReplayDrafter(name, DrafterConfig(use_global_tree=False, use_local_tree=False,
                                                    share_running_siblings=False))
    if name == "das+global":
        return DASReplayDrafter(name, DrafterConfig(share_running_siblings=False))
    if name == "das+siblings":
        return DASReplayDrafter(name, DrafterConfig())
    if name == "das+policy":
        pc = LengthPolicyConfig(**{**pc.to_dict(), "mode": "tiers"})
        return DASReplayDrafter(name, DrafterConfig(max_spec_tokens=max(1, pc.max_budget)), LengthPolicy(pc))
    if name == "das+cost":
        pc = LengthPolicyConfig(**{**pc.to_dict(), "mode": "cost"})
        return DASReplayDrafter(name, DrafterConfig(max_spec_tokens=max(1, pc.max_budget)), LengthPolicy(pc))
    if name == "das+controller":
        return DASControllerDrafter(name, DrafterConfig(), controller_config or ControllerConfig(cost_source="config"))
    raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(ALL_DRAFTERS)}")


def draft_cap(das_overrides: dict | None = None) -> int:
    """The hard draft cap K (``max_spec_tokens``) of :func:`make_drafter`'s DAS drafters under ``das_overrides``:
    the cap of the replay's and the suite's bounds (``oracle-text``)."""
    return _DrafterConfig(**{k: v for k, v in (das_overrides or {}).items() if k != "draft_threads"}).max_spec_tokens


def controller_config(c_base: float, c_tok: float, overrides: dict | None = None, c_logprob: float | None = None,
                      verification_shape: str = "patched") -> ControllerConfig:
    """The ``das+controller`` settings of a replay: the replay's own cost model (``cost_source="config"``; a replay
    has no step timings to fit), its logprob price and shape as the proposer gives them (``c_logprob`` ``None``: the
    controller's default), then ``overrides`` (ControllerConfig fields; they may set what the controller believes
    ``c_logprob_ms`` / ``verification_shape`` to be)."""
    engine = {"c_logprob_ms": c_logprob, "verification_shape": verification_shape}
    return ControllerConfig(**{**engine, **(overrides or {}), "cost_source": "config", "c_base_ms": c_base,
                               "c_tok_ms": c_tok})
