"""Engine sizes das-trl chooses when the user does not (no engine started): the model length with K tokens of
drafting headroom is clamped to the model's context length, with a warning that says what it costs (colocate mode
and ``das-trl serve``), and ``das-trl serve`` / the live A/B script run at most ``DEFAULT_SERVER_MAX_NUM_SEQS`` rows
unless told otherwise (``docs/gpu.md``, "Engine settings for DAS")."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from das_trl.vllm import serve
from das_trl.vllm.engine import (DEFAULT_SERVER_MAX_NUM_SEQS, SCHEDULER_QUALNAME, default_max_num_batched_tokens,
                                 fit_model_len, model_context_length)

ROOT = Path(__file__).resolve().parents[1]
K = 64


def test_context_length_is_the_one_vllm_enforces(model_path):
    """vLLM accepts the packaged model at the length read here and refuses one token more."""
    from transformers import AutoConfig
    from vllm.engine.arg_utils import EngineArgs

    length, key = model_context_length(AutoConfig.from_pretrained(model_path))
    assert (length, key) == (8192, "max_position_embeddings")
    args = dict(model=model_path, kv_cache_memory_bytes=256 * 1024**2, enforce_eager=True)
    assert EngineArgs(max_model_len=length, **args).create_engine_config().model_config.max_model_len == length
    with pytest.raises(Exception, match="greater than the derived max_model_len"):
        EngineArgs(max_model_len=length + 1, **args).create_engine_config()


def test_context_length_keys_and_rope_scaling():
    def config(**fields):
        return SimpleNamespace(**fields)

    assert model_context_length(config(max_position_embeddings=4096, n_positions=2048)) == (2048, "n_positions")
    assert model_context_length(config(max_position_embeddings=4096, model_max_length=8192)) == (8192,
                                                                                               "model_max_length")
    linear = config(max_position_embeddings=4096, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert model_context_length(linear) == (8192, "max_position_embeddings")
    yarn = config(max_position_embeddings=32768, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert model_context_length(yarn) == (32768, "max_position_embeddings")  # already scaled in the config
    assert model_context_length(config(hidden_size=8)) is None


def test_headroom_is_clamped_to_the_context_length_with_its_cost():
    context = (2048, "max_position_embeddings")
    assert fit_model_len(1024, K, context, environ={}) == (1024 + K, None)  # fits: K of headroom
    assert fit_model_len(2048 - K, K, context, environ={}) == (2048, None)
    length, warning = fit_model_len(2000, K, context, environ={})
    assert length == 2048
    assert "2064" in warning and "context length 2048" in warning  # what was asked, what the model has
    assert "longer than 1984 tokens" in warning and "placeholder" in warning  # what it costs
    assert "within 1984 tokens" in warning and "lower K to 48" in warning  # what to set instead
    assert fit_model_len(2048, K, context, environ={})[0] == 2048  # no headroom left at all: still clamped
    assert fit_model_len(3000, K, context, environ={}) == (3000, None)  # the model cannot hold it: vLLM says so
    assert fit_model_len(2000, K, context, environ={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}) == (2064, None)
    assert fit_model_len(2000, K, None, environ={}) == (2064, None)


class _Policy(torch.nn.Module):
    """What the colocate path reads from the policy: its path, config, modules and parameter dtype."""

    def __init__(self, max_positions: int):
        super().__init__()
        self.name_or_path = "/models/policy"
        self.config = SimpleNamespace(max_position_embeddings=max_positions)
        self.proj = torch.nn.Linear(2, 2)


@pytest.mark.parametrize("user_len", [None, 300])
def test_colocated_engine_gets_the_clamped_length_and_a_warning(caplog, monkeypatch, user_len):
    from das_trl.trainer.config import das_settings
    from das_trl.trainer.generation import DASVLLMGeneration

    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    gen = object.__new__(DASVLLMGeneration)
    settings = das_settings(SimpleNamespace())
    settings.update({"num_speculative_tokens": K,
                     "vllm_kwargs": {} if user_len is None else {"max_model_len": user_len}})
    gen.das, gen.engine, gen.model = settings, None, _Policy(max_positions=280)
    gen.accelerator = SimpleNamespace(process_index=0, local_process_index=0, num_processes=1, mixed_precision="no")
    gen.tensor_parallel_size, gen.gpu_memory_utilization, gen.max_model_length = 1, 0.3, 256
    gen.max_num_seqs, gen.enable_sleep_mode, gen.model_impl, gen.trust_remote_code = 8, False, "auto", False
    with caplog.at_level(logging.WARNING, logger="das_trl.trainer.generation"):
        kwargs = gen._colocate_llm_kwargs()
    if user_len is None:
        assert kwargs["max_model_len"] == 280  # not 256 + 64 = 320, which vLLM would refuse
        assert "context length 280" in caplog.text and "vllm_max_model_length" in caplog.text
    else:  # the user's own length is taken as it is, without a warning about one das-trl did not choose
        assert kwargs["max_model_len"] == 300 and "context length" not in caplog.text
    assert kwargs["scheduler_cls"] == SCHEDULER_QUALNAME


def test_serve_clamps_max_model_len_to_the_models_length(model_path):
    args = serve.build_parser().parse_args(["--model", model_path, "--max-model-len", "8200"])
    warning = serve.fit_server_model_len(args)  # 8136 tokens of rollout + K = 64 of headroom: the headroom is cut
    assert args.max_model_len == 8192 and "--max-model-len" in warning and "context length 8192" in warning
    past = serve.build_parser().parse_args(["--model", model_path, "--max-model-len", "8300"])
    assert serve.fit_server_model_len(past) is None and past.max_model_len == 8300  # more than K past: vLLM refuses
    fits = serve.build_parser().parse_args(["--model", model_path, "--max-model-len", "4096"])
    assert serve.fit_server_model_len(fits) is None and fits.max_model_len == 4096
    unknown = serve.build_parser().parse_args(["--model", "/no/such/model", "--max-model-len", "9000"])
    assert serve.fit_server_model_len(unknown) is None and unknown.max_model_len == 9000  # vLLM decides


def test_serve_runs_a_safe_number_of_rows_unless_told():
    from test_gpu_readiness import _vllm_server_parser

    args = serve.build_parser().parse_args(["--model", "/models/m"])
    command = serve.build_command(args, [], cpu=False, release=(0, 33, 0))
    parsed = _vllm_server_parser().parse_args(command[3:])
    assert parsed.max_num_seqs == DEFAULT_SERVER_MAX_NUM_SEQS == 256
    assert parsed.max_num_batched_tokens == default_max_num_batched_tokens(K, DEFAULT_SERVER_MAX_NUM_SEQS, cpu=False)
    assert parsed.scheduler_cls == SCHEDULER_QUALNAME
    own = serve.build_command(args, ["--max-num-seqs", "1024"], cpu=False, release=(0, 33, 0))
    assert own.count("--max-num-seqs") == 1 and _vllm_server_parser().parse_args(own[3:]).max_num_seqs == 1024
    script = (ROOT / "recipes" / "gpu" / "run_live_ab.sh").read_text()
    assert re.search(r'--max-num-seqs "\$\{MAX_NUM_SEQS:-(\d+)\}"', script).group(1) == str(DEFAULT_SERVER_MAX_NUM_SEQS)
