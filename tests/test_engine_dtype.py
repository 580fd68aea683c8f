"""The engine's dtype follows the trainer's compute dtype unless the user chose one.

The real-engine check (default configuration samples at float32 level) is in tests/test_trainer.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from das_trl.vllm.dtype import (checkpoint_dtype, colocate_engine_dtype, dtype_mismatch_message, dtype_name,
                                serve_engine_dtype, trainer_compute_dtype)


def _model(dtype):
    return torch.nn.Linear(2, 2).to(dtype)


@pytest.mark.parametrize("dtype,mixed,expected", [
    (torch.float32, "no", "float32"),
    (torch.bfloat16, "no", "bfloat16"),
    (torch.float32, "bf16", "bfloat16"),
    (torch.float32, "fp16", "float16"),
    (torch.float16, None, "float16"),
])
def test_colocate_engine_follows_trainer_compute_dtype(dtype, mixed, expected):
    chosen, why = colocate_engine_dtype({"enforce_eager": True}, _model(dtype), mixed)
    assert chosen == expected and "compute dtype" in why
    assert trainer_compute_dtype(_model(dtype), mixed) == expected


def test_colocate_user_dtype_wins():
    assert colocate_engine_dtype({"dtype": "bfloat16"}, _model(torch.float32), "no") == ("bfloat16",
                                                                                        "set by das_vllm_kwargs")


def test_colocate_unknown_trainer_dtype_falls_back_to_auto():
    assert colocate_engine_dtype(None, object(), "no")[0] == "auto"


def test_serve_uses_checkpoint_dtype(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    assert serve_engine_dtype(None, str(tmp_path))[0] == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert serve_engine_dtype(None, str(tmp_path))[0] == "bfloat16"
    assert serve_engine_dtype("float16", str(tmp_path)) == ("float16", "set by --dtype")
    (tmp_path / "config.json").write_text("{}")
    assert serve_engine_dtype(None, str(tmp_path))[0] == "auto"


def test_packaged_model_is_float32(model_path):
    # vLLM's 'auto' turns this float32 checkpoint into bfloat16; das-trl keeps float32.
    assert checkpoint_dtype(model_path) == "float32"


def test_serve_command_line_carries_the_dtype(model_path):
    from das_trl.vllm.serve import build_command, build_parser

    args = build_parser().parse_args(["--model", model_path])
    assert args.dtype is None  # resolved in main(): serve_engine_dtype
    args.dtype = serve_engine_dtype(args.dtype, args.model)[0]
    command = build_command(args, [], cpu=True)
    assert command[command.index("--dtype") + 1] == "float32"


def test_dtype_names_and_mismatch_message():
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name("torch.float32") == "float32"
    assert dtype_name("auto") is None
    assert dtype_mismatch_message("bfloat16", "float32") is not None
    assert "das-trl serve --dtype float32" in dtype_mismatch_message("torch.bfloat16", "float32")
    assert dtype_mismatch_message("float32", "float32") is None
    assert dtype_mismatch_message(None, "float32") is None
