"""TRL's HTTP client for vLLM's server, with the generate endpoint's logprobs read as vLLM 0.32/0.33 write them.

TRL 1.16 (``trl/generation/vllm_client.py``) sends prompts with images, and every prompt of a batch that has one, to
vLLM's ``/inference/v1/generate`` (a scale-out endpoint: ``das-trl serve`` turns it on with ``--enable-scale-out``).
Its ``parse_logprobs`` reads each logprob entry's ``"token"`` (``"token_id:<id>"``, the OpenAI shape), but vLLM 0.32's
generate protocol (``GenerateLogProb`` in ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``) carries an
integer ``"token_id"`` instead, so TRL 1.16 fails with ``KeyError: 'token'`` on every such batch (TRL 1.16 declares
vLLM <= 0.31). :class:`DASVLLMClient` adds the ``"token"`` field to those replies; text-only batches
(``/v1/completions``) are untouched.
"""

from __future__ import annotations

import re
from typing import Any

from trl.generation.vllm_client import VLLMClient

GENERATE_PATH = "/inference/v1/generate"

#: How TRL 1.16's client words a reply that is not 200 (``VLLMClient._get`` / ``_post`` and others): a bare
#: ``Exception(f"Request failed: {status_code}, {text}")``.
_REQUEST_FAILED = re.compile(r"Request failed: (\d{3}),")


def failed_request_status(exc: BaseException) -> int | None:
    """The HTTP status of TRL's client's bare ``Exception("Request failed: <status>, <body>")``; ``None`` for any
    other exception (subclasses included: only TRL's own bare form is read)."""
    match = _REQUEST_FAILED.match(str(exc)) if type(exc) is Exception else None
    return int(match.group(1)) if match else None


def normalize_generate_logprobs(reply: Any) -> Any:
    """Give each logprob entry of a ``/inference/v1/generate`` reply the ``"token": "token_id:<id>"`` field TRL reads.

    Args:
        reply: the decoded JSON reply (``{"choices": [{"logprobs": {"content": [{"token_id": int, "logprob": float,
            "top_logprobs": [{"token_id": int, ...}]}]}}]}``); changed in place. Entries that already have
            ``"token"`` (older vLLM) and replies without logprobs are left as they are.

    Returns:
        ``reply``.
    """
    choices = reply.get("choices") if isinstance(reply, dict) else None
    for choice in choices or []:
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        for entry in content or []:
            for item in (entry, *(entry.get("top_logprobs") or [])):
                if "token" not in item and "token_id" in item:
                    item["token"] = f"token_id:{int(item['token_id'])}"
    return reply


class DASVLLMClient(VLLMClient):
    """``trl.generation.vllm_client.VLLMClient`` (same arguments) whose generate-endpoint replies TRL 1.16 can parse
    with vLLM 0.32/0.33 (:func:`normalize_generate_logprobs`)."""

    def _post(self, url: str, **kwargs: Any) -> dict:
        reply = super()._post(url, **kwargs)
        if url.endswith(GENERATE_PATH):
            normalize_generate_logprobs(reply)
        return reply
