"""das_* settings: the removed length policy is refused with its replacement named; the controller's fields are
validated up front. Fast (no engine)."""

from types import SimpleNamespace

import pytest

from das_trl.trainer.config import das_settings, drafter_config_fields, validate_das_settings


def _settings(**das):
    return das_settings(SimpleNamespace(**{f"das_{k}": v for k, v in das.items()}))


def test_length_policy_is_refused_and_names_the_budget_controller():
    with pytest.raises(ValueError, match="das_budget_controller") as err:
        validate_das_settings(_settings(length_policy={"mode": "tiers"}))
    assert "das+policy" in str(err.value)


def test_budget_controller_is_the_one_budget_path_sent_to_the_engine():
    settings = _settings(budget_controller='{"c_tok_ms": 0.1}')
    validate_das_settings(settings)
    fields = drafter_config_fields(settings)
    assert fields["budget_controller"] == {"c_tok_ms": 0.1} and "length_policy" not in fields
    with pytest.raises(ValueError, match="das_budget_controller"):
        validate_das_settings(_settings(budget_controller={"c_tok_ms": -1}))
