"""das_* settings: the removed length policy is refused with its replacement named; the controller's fields and the
tree depth are validated up front, and the depth reaches the engine's drafter through das_attach. Fast (a fake
worker, no engine)."""

import json
from types import SimpleNamespace

import pytest

from das_trl.trainer.config import das_settings, drafter_config_fields, validate_das_settings
from reliability_fakes import K, FakeWorker


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


def test_tree_depth_reaches_the_engine_and_bad_depths_are_refused_up_front():
    settings = _settings()
    validate_das_settings(settings)
    assert "max_tree_depth" not in drafter_config_fields(settings)  # the engine's own (a server's may differ)
    worker = FakeWorker()
    assert worker.das_attach(json.dumps({"max_tree_depth": 96}))["ok"]
    assert worker.das_attach(json.dumps(drafter_config_fields(_settings(num_speculative_tokens=K))))["ok"]
    assert worker.proposer.drafter.config.max_tree_depth == 96  # unset in the trainer: the engine's setting holds
    settings = _settings(max_tree_depth=48, num_speculative_tokens=K)
    validate_das_settings(settings)
    assert drafter_config_fields(settings)["max_tree_depth"] == 48
    worker = FakeWorker()  # the engine's side of das_attach (what colocate and server mode send)
    assert worker.das_attach(json.dumps(drafter_config_fields(settings)))["ok"]
    assert worker.proposer.drafter.config.max_tree_depth == 48
    for bad in (0, 4097, 64.0, True, "64", 2):  # 2: below the drafter's support_ngram (3)
        with pytest.raises(ValueError, match=r"das_max_tree_depth must be None or an int in \[3, 4096\]"):
            validate_das_settings(_settings(max_tree_depth=bad))


@pytest.mark.parametrize("depth", [3, 16, 31, 32, 4096])
def test_every_depth_the_config_accepts_attaches(depth):
    # The engine's base config has the matched tail derived from its depth (32 at depth 64): a shallower depth from
    # the trainer or a server's --drafter-config derives it again (min(32, depth)) instead of being refused for it.
    settings = _settings(max_tree_depth=depth, num_speculative_tokens=K)
    validate_das_settings(settings)
    worker = FakeWorker()
    reply = worker.das_attach(json.dumps(drafter_config_fields(settings)))
    assert reply["ok"], reply
    cfg = worker.proposer.drafter.config
    assert cfg.max_tree_depth == depth and cfg.match_context_tokens == min(32, depth)
    # a tail someone set is kept (and one deeper than the new depth is refused, naming both)
    worker = FakeWorker()
    assert worker.das_attach(json.dumps({"match_context_tokens": 8}))["ok"]
    assert worker.das_attach(json.dumps({"max_tree_depth": max(depth, 8)}))["ok"]
    assert worker.proposer.drafter.config.match_context_tokens == 8


@pytest.mark.parametrize("name, value, says", [
    ("window", 2.5, "das_window must be an int in [1, "),
    ("window", float("nan"), "das_window must be an int"),
    ("window", True, "das_window must be an int"),
    ("window", "8", "das_window must be an int"),
    ("history_token_budget", float("inf"), "das_history_token_budget must be an int"),
    ("history_token_budget", 1.5, "das_history_token_budget must be an int"),
    ("max_spec_factor", float("nan"), "das_max_spec_factor must be a finite number"),
    ("max_spec_factor", float("inf"), "das_max_spec_factor must be a finite number"),
    ("max_spec_factor", "2", "das_max_spec_factor must be a finite number"),
    ("min_token_prob", "0.5", "das_min_token_prob must be a finite number"),
    ("live_token_budget", -1, "das_live_token_budget must be an int in [0, "),
    ("calibrate_acceptance", "yes", "das_calibrate_acceptance must be a bool"),
    ("enabled", "no", "das_enabled must be true or false, got 'no'"),
    ("check_engine", None, "das_check_engine must be true or false"),
    ("record_rollouts", 123, "das_record_rollouts must be None or a file path"),
    ("record_rollouts", "", "das_record_rollouts must be None or a file path"),
])
def test_bad_values_are_refused_when_the_config_is_built_naming_the_setting(name, value, says):
    """These passed the config's own checks (or raised a bare TypeError) and failed only at the engine's attach,
    after the model had loaded, naming the drafter's field (``window``) instead of the setting (``das_window``)."""
    with pytest.raises(ValueError) as err:
        validate_das_settings(_settings(**{name: value}))
    assert says in str(err.value)


def test_every_value_the_config_accepts_builds_the_drafter():
    """What passes here is what the engine's DrafterConfig accepts (ints given as whole floats are not)."""
    from das_trl.drafter import DrafterConfig

    settings = _settings(window=3, history_token_budget=1000, max_spec_factor=1, min_token_prob=0,
                         live_token_budget=0, record_rollouts="runs/r.jsonl")
    validate_das_settings(settings)
    fields = drafter_config_fields(settings)
    fields.pop("budget_controller")  # the engine's ControllerConfig, beside the drafter's
    DrafterConfig(**fields)


def test_bad_json_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("DAS_TRL_VLLM_KWARGS", "{bad")
    with pytest.raises(ValueError, match=r"das_vllm_kwargs \(from \$DAS_TRL_VLLM_KWARGS\) is not valid JSON"):
        validate_das_settings(_settings())
    with pytest.raises(ValueError, match=r"das_vllm_kwargs is not valid JSON"):  # set in the config: no variable named
        validate_das_settings(_settings(vllm_kwargs="{worse"))
