"""The response parser TRL's asynchronous rollout worker needs on the tokenizer, for ChatML templates TRL does not list.

TRL 1.16's rollout loop parses every generated turn with ``tokenizer.parse_response`` and, when the tokenizer has no
response template, calls ``trl.chat_template_utils.add_response_schema``, which knows a fixed list of chat templates
and raises ``ValueError: Unrecognized chat template`` for any other (``async_rollout_worker.py:366-369``; the child
process then dies at ``train()``). SmolLM2 (das-trl's packaged model) and other ChatML models are not on the list.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

logger = logging.getLogger(__name__)

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")


def ensure_response_parsing(tokenizer: Any) -> str:
    """Make sure ``tokenizer`` can parse responses the way TRL's rollout worker does; sets it up in place if not.

    A tokenizer that already has a response template (or legacy schema) is left alone; one whose template TRL knows
    gets TRL's (``add_response_schema``); a ChatML template (``<|im_start|>`` / ``<|im_end|>``) gets TRL's Qwen parser,
    which reads the same markers (content, ``<think>`` reasoning and ``<tool_call>`` JSON; anything it cannot parse is
    kept as plain text by TRL's ``parse_response``).

    Args:
        tokenizer: a ``PreTrainedTokenizerBase`` (or a processor with a ``tokenizer``).

    Returns:
        what was done: ``"present"``, ``"trl"`` or ``"chatml"``.

    Raises:
        ValueError: another chat template; the message says what to set.
    """
    from trl.chat_template_utils import _SUPPORTS_RESPONSE_TEMPLATE, add_response_schema, qwen3_schema, qwen3_template

    inner = getattr(tokenizer, "tokenizer", tokenizer)
    if getattr(inner, "response_template", None) is not None or getattr(inner, "response_schema", None) is not None:
        return "present"
    try:
        add_response_schema(tokenizer)
        return "trl"
    except ValueError:
        pass
    template = getattr(tokenizer, "chat_template", None) or ""
    if not all(marker in str(template) for marker in CHATML_MARKERS):
        raise ValueError(
            "TRL's asynchronous rollout worker parses each response with tokenizer.parse_response, and TRL 1.16 has no "
            "response parser for this tokenizer's chat template. Set one before building the trainer: "
            "tokenizer.response_template = {...} (transformers >= 5.13; see transformers' 'chat response parsing' "
            "docs), then pass processing_class=tokenizer.")
    if _SUPPORTS_RESPONSE_TEMPLATE:
        inner.response_template = copy.deepcopy(qwen3_template)
    else:
        inner.response_schema = copy.deepcopy(qwen3_schema)
    logger.info("ChatML chat template: responses are parsed with TRL's Qwen (ChatML) parser")
    return "chatml"
