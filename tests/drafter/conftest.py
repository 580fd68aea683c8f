"""Shared helpers for drafter tests (small support tables keep construction fast)."""

import numpy as np
import pytest

from das_trl.drafter import DASDrafter, DrafterConfig


def make_drafter(**kw) -> DASDrafter:
    kw.setdefault("support_table_bits", 16)
    return DASDrafter(DrafterConfig(**kw))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
