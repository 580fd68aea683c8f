"""Helpers for drafter tests (small support tables keep construction fast)."""

from das_trl.drafter import DrafterConfig
from das_trl.drafter.reference import DASDrafter


def make_drafter(**kw) -> DASDrafter:
    kw.setdefault("support_table_bits", 16)
    return DASDrafter(DrafterConfig(**kw))
