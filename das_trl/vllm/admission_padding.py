"""vLLM's admission padding, and how a DAS engine's scheduler turns it off.

vLLM's scheduler (``Scheduler.schedule``, ``vllm/v1/core/sched/scheduler.py``, in the 0.32 CPU build and 0.33.0)
pads a request it admits with exactly one token left to compute to ``1 + K`` tokens, with ``K`` placeholder drafts
(token id -1), "to uniform spec decoding size to preserve full cudagraph for this step"::

    if ((self.num_spec_tokens > 0 and self.dynamic_sd_lookup is None)
            and self.num_sampled_tokens_per_step > 0 and num_new_tokens == 1 and not prefill_scheduled
            and (scheduled_running_reqs or num_computed_tokens > 0)):
        padded_num_tokens = 1 + self.num_spec_tokens
        ...
        if padded_num_tokens > request_token_budget:
            break  # "Prefer to not schedule than schedule un-padded."

One token left happens when the prefix cache holds all of the prompt but its last token: a GRPO sibling whose prompt
is ``1 + a multiple of the KV block size`` long (block-granular hits stop one token short of the prompt), or a
preempted request resumed likewise. Each such admission costs ``K`` verified placeholder positions (all rejected: -1
is never the target's token), takes ``1 + K`` tokens of the step's budget (and waits a step when fewer are left), and
through vLLM's padded logprob path pads every row of the step to ``K + 1`` positions. A DAS step is never a uniform
decode batch (drafts are ragged), so the full CUDA graph the padding keeps is never used: the padding buys nothing.

:func:`unpad_admissions` turns it off on one scheduler through the condition's own switch: a dynamic speculation
lookup (``dynamic_sd_lookup``) that gives ``K`` at every batch size, the value vLLM would use without one, so the
only change is that admitted requests are scheduled with their one token, as without speculation. It checks first
that the scheduler's code uses the lookup as the two releases above do (:func:`padding_switch_is_known`).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

logger = logging.getLogger("vllm.das_trl.admission_padding")

# The padding condition and the lookup's only other use, as vLLM 0.32 / 0.33.0 write them.
_PADDING_CONDITION = "(self.num_spec_tokens > 0 and self.dynamic_sd_lookup is None)"
_LOOKUP_USE = "num_spec_tokens_to_schedule = self.dynamic_sd_lookup["


def padding_switch_is_known(scheduler_cls: type) -> bool:
    """Whether ``scheduler_cls.schedule`` (vLLM's, or a subclass's inherited one) pads admissions under the condition
    above and reads ``dynamic_sd_lookup`` nowhere else but to pick ``K`` per batch size."""
    schedule = None
    for cls in scheduler_cls.__mro__:  # the class that writes the condition (a subclass may wrap schedule)
        method = cls.__dict__.get("schedule")
        if method is not None:
            try:
                source = inspect.getsource(method)
            except (OSError, TypeError):
                continue
            if _PADDING_CONDITION in source:
                schedule = source
                break
    if schedule is None:
        return False
    return schedule.count("self.dynamic_sd_lookup") == 3 and _LOOKUP_USE in schedule


def unpad_admissions(scheduler: Any) -> bool:
    """Turn vLLM's admission padding off on ``scheduler`` (a V1 ``Scheduler`` of a speculating engine).

    Sets ``scheduler.dynamic_sd_lookup`` to ``K`` for every batch size ``0 .. max_num_seqs`` (so
    ``num_spec_tokens_to_schedule`` stays ``K``) when the scheduler has no lookup of its own and its code is one
    :func:`padding_switch_is_known` recognises. Call it from the scheduler's ``__init__``.

    Returns:
        True when the padding is off; False (and a log line) when the scheduler does not speculate, has a lookup of
        its own (vLLM's ``num_speculative_tokens_per_batch_size``), or its code is not recognised (the padding then
        stays, bounded as ``docs/gpu.md`` says).
    """
    k = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    if k <= 0 or getattr(scheduler, "dynamic_sd_lookup", "missing") is not None:
        return False
    if not padding_switch_is_known(type(scheduler)):
        logger.warning("das_trl: this vLLM's Scheduler.schedule is not one das-trl knows: admitted requests with one "
                       "token left keep vLLM's padding to 1 + K = %d tokens", 1 + k)
        return False
    scheduler.dynamic_sd_lookup = [k] * (int(scheduler.scheduler_config.max_num_seqs) + 1)
    return True
