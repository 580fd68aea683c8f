"""``das-trl bench cost-profile --random-init``: a model's forward-pass cost profile from its config alone.

A tiny Qwen2 config (no weights anywhere) is built with random weights on the CPU and timed over a 2 x 2 grid; the
JSON holds one point per (B, q) with T = B * q tokens, the parameter count of the built model and the fit.
"""

from __future__ import annotations

import json

import pytest

from das_trl.bench.micro import cost_profile

TINY_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 512, "max_position_embeddings": 256, "tie_word_embeddings": True}


def test_random_init_profiles_a_model_from_its_config(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_QWEN2))
    out = tmp_path / "profile.json"
    assert cost_profile.main(["--model", str(tmp_path / "model"), "--random-init", "--batch", "1,3",
                              "--query", "1,2", "--context", "8", "--repeats", "1", "--device", "cpu",
                              "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["random_init"] is True and result["device"] == "cpu"
    # embeddings (tied) + 2 layers: far more than zero, far less than any real model
    assert 10_000 < result["parameters"] < 1_000_000
    assert [(p["batch"], p["query"], p["tokens"]) for p in result["points"]] == [(1, 1, 1), (1, 2, 2), (3, 1, 3),
                                                                               (3, 2, 6)]
    assert all(p["ms"] > 0 for p in result["points"])


def test_without_random_init_a_config_alone_is_not_a_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN2))
    with pytest.raises(OSError):  # transformers: no weights file in the directory
        cost_profile.main(["--model", str(tmp_path), "--batch", "1", "--query", "1,2", "--context", "8",
                           "--repeats", "1", "--device", "cpu"])
