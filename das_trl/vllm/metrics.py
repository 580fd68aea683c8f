"""vLLM's own speculative-decoding counters (the authoritative acceptance figures), in-process or from ``/metrics``.

Counter names (vLLM V1, ``vllm/v1/spec_decode/metrics.py``): ``vllm:spec_decode_num_drafts``,
``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens`` and the per-position vector
``vllm:spec_decode_num_accepted_tokens_per_pos``. They exist only when the engine logs stats
(``disable_log_stats=False``) and speculation is configured.
"""

from __future__ import annotations

import re
from typing import Any

_SCALARS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_decode_counters(llm: Any) -> dict[str, Any]:
    """Spec-decode counters of an in-process ``vllm.LLM`` (summed over engines).

    Returns:
        ``{"num_drafts": int, "num_draft_tokens": int, "num_accepted_tokens": int,
        "accepted_per_pos": list[int]}``; all zero when the engine has no speculation or logs no stats.
    """
    out: dict[str, Any] = {v: 0 for v in _SCALARS.values()}
    per_pos: list[int] = []
    for metric in llm.get_metrics():
        if metric.name in _SCALARS:
            out[_SCALARS[metric.name]] += int(metric.value)
        elif metric.name == _PER_POS:
            values = [int(v) for v in metric.values]
            per_pos = [a + b for a, b in zip(per_pos, values)] + values[len(per_pos):] if per_pos else values
    out["accepted_per_pos"] = per_pos
    return out


_PROM_LINE = re.compile(r'^(vllm:spec_decode_num_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$')


def parse_prometheus_spec_decode(text: str) -> dict[str, Any]:
    """The same counters from a server's ``GET /metrics`` text (Prometheus exposition format)."""
    out: dict[str, Any] = {v: 0 for v in _SCALARS.values()}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        match = _PROM_LINE.match(line.strip())
        if not match:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        if name in _SCALARS:
            out[_SCALARS[name]] += int(value)
        elif name == _PER_POS:
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0) + int(value)
    out["accepted_per_pos"] = [per_pos[i] for i in sorted(per_pos)]
    return out
