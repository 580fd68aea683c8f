"""Shared fixtures: the real packaged model and real CPU vLLM engines (built once per test module)."""

from __future__ import annotations

import pytest

@pytest.fixture(scope="session")
def model_path() -> str:
    """The embedded SmolLM2-135M-Instruct as an HF directory (converted once, then cached)."""
    from das_trl.defaults.model import prepare_default_model

    return prepare_default_model()


