"""Reliability case 8: sampling parameters that vLLM rejects with speculation on (or that weaken drafting) are
detected before a run; the trainer fails early on the rejected ones. (``test_reliability_engine.py`` checks the
table against a real engine.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from das_trl.vllm.sampling_check import check_sampling_params, format_issues, trl_sampling_params


def _severities(params, **kw):
    return {i.param: i.severity for i in check_sampling_params(params, **kw)}


def test_defaults_and_trl_defaults_have_no_issues():
    assert check_sampling_params({}) == []
    trl = dict(repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=None, min_p=None)
    assert check_sampling_params(trl) == []


def test_rejected_parameters_are_errors():
    assert _severities({"min_p": 0.05}) == {"min_p": "error"}
    assert _severities({"logit_bias": {1: 2.0}}) == {"logit_bias": "error"}
    assert _severities({"n": 4, "temperature": 0.0}) == {"n": "error"}
    assert _severities({"n": 4, "temperature": 0.7}) == {}
    assert _severities({"seed": 3}) == {}
    assert _severities({"seed": 3}, cpu_build=True) == {"seed": "error"}


def test_penalties_and_constraints_are_notes():
    found = _severities({"repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.2,
                         "bad_words": ["x"], "allowed_token_ids": [1, 2], "min_tokens": 4})
    assert set(found.values()) == {"note"} and len(found) == 6
    issues = check_sampling_params({"repetition_penalty": 1.1, "min_p": 0.1})
    assert [i.severity for i in issues] == ["error", "note"]  # errors first
    assert "min_p=0.1" in format_issues(issues)


def test_vllm_sampling_params_object_is_accepted():
    from vllm import SamplingParams

    assert _severities(SamplingParams(min_p=0.1, repetition_penalty=1.2)) == {"min_p": "error",
                                                                          "repetition_penalty": "note"}


def test_trainer_fails_early_on_rejected_params_and_logs_notes(caplog):
    from das_trl.trainer.trainer import DASGRPOTrainer

    trainer = DASGRPOTrainer.__new__(DASGRPOTrainer)
    args = SimpleNamespace(repetition_penalty=1.0, temperature=0.8, top_p=1.0, top_k=None, min_p=0.1,
                           generation_kwargs=None)
    with pytest.raises(ValueError, match="min_p"):
        trainer._das_check_sampling(args)
    args.min_p, args.generation_kwargs = None, {"logit_bias": {5: 1.0}}
    assert trl_sampling_params(args)["logit_bias"] == {5: 1.0}
    with pytest.raises(ValueError, match="logit_bias"):
        trainer._das_check_sampling(args)
    args.generation_kwargs = {"presence_penalty": 0.3}
    trainer._das_check_sampling(args)
    assert "presence_penalty" in caplog.text
