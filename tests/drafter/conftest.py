"""Fixtures for drafter tests (helpers are in drafter_utils.py: a module named conftest is not importable reliably
when several test folders have one)."""

import numpy as np
import pytest



@pytest.fixture
def rng():
    return np.random.default_rng(1234)
