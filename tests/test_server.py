"""Server mode: ``das-trl serve`` (vLLM's OpenAI server + DAS), TRL's client, and DASGRPOTrainer over HTTP.

Also: a plain vLLM server (dev mode, no DAS) is reported as "not a DAS engine" at trainer start, not as a hang.
"""

from __future__ import annotations

import os
import sys

import pytest
from server_utils import SERVER_ARGS, free_port, start, start_das_server, stop

pytestmark = [pytest.mark.engine, pytest.mark.trainer]


@pytest.fixture(scope="module")
def das_server(model_path):
    base_url, process = start_das_server(model_path)
    yield base_url
    stop(process)


def test_serve_attaches_and_trl_client_generates_with_drafts(das_server, model_path):
    import requests
    from trl.generation.vllm_client import VLLMClient

    from das_trl.vllm.client import HTTPDASEngine
    from das_trl.vllm.metrics import parse_prometheus_spec_decode

    engine = HTTPDASEngine(das_server)
    assert engine.stats()["attached"] is True
    client = VLLMClient(base_url=das_server, connection_timeout=10)
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(model_path).apply_chat_template(
        [{"role": "user", "content": "List the even numbers from 2 to 30."}], add_generation_prompt=True,
        tokenize=True, return_dict=False)
    # TRL's request shape (logprobs=0, sampling): the CPU sampling fix keeps logprobs finite and JSON-safe.
    out = client.generate([prompt], n=4, temperature=0.8, max_tokens=32, logprobs=0)
    assert len(out["completion_ids"]) == 4 and all(len(c) > 0 for c in out["completion_ids"])
    engine.add_history([prompt] * 4, out["completion_ids"])
    greedy = client.generate([prompt], n=1, temperature=0.0, max_tokens=32, logprobs=0)
    engine.add_history([prompt], greedy["completion_ids"])
    again = client.generate([prompt], n=1, temperature=0.0, max_tokens=32, logprobs=0)
    assert again["completion_ids"] == greedy["completion_ids"]
    counters = parse_prometheus_spec_decode(requests.get(f"{das_server}/metrics", timeout=10).text)
    assert counters["num_accepted_tokens"] > 0, counters


def test_trainer_server_mode_two_steps(das_server, tmp_path, model_path):
    from das_trl.defaults.data import load_reasoning_gym_dataset
    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOConfig, DASGRPOTrainer
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine(das_server)
    engine.reset("all")
    args = DASGRPOConfig(
        output_dir=str(tmp_path / "run"), use_vllm=True, vllm_mode="server", vllm_server_base_url=das_server,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=32, temperature=0.8,
        learning_rate=1e-5, beta=0.0, max_steps=2, logging_steps=1, save_strategy="no", report_to="none",
        seed=0, bf16=False, das_num_speculative_tokens=8,
    )
    trainer = DASGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args,
                             train_dataset=load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0))
    assert trainer.vllm_generation.weight_sync == "reload"  # CPU build: weights travel by file + reload
    trainer.train()
    logs = [h for h in trainer.state.log_history if "das/rollout_seconds" in h]
    assert len(logs) == 2
    assert logs[1]["das/accepted_tokens"] > 0
    assert engine.stats()["history_sequences"] == 16
    # `das-trl serve` without --dtype runs the checkpoint's float32, the trainer's dtype: float32-level logprobs.
    assert engine.stats()["engine_dtype"] == "float32"
    assert all(h["sampling/sampling_logp_difference/mean"] < 1e-3 for h in logs), logs


def test_plain_vllm_server_is_reported_as_not_das(model_path, tmp_path):
    from das_trl.defaults.data import load_reasoning_gym_dataset
    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOConfig, DASGRPOTrainer
    from das_trl.vllm.client import DASEngineError

    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
               "--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS]
    process = start(command, port, env=dict(os.environ, VLLM_SERVER_DEV_MODE="1"))
    try:
        args = DASGRPOConfig(output_dir=str(tmp_path / "run"), use_vllm=True, vllm_mode="server",
                             vllm_server_base_url=f"http://127.0.0.1:{port}", num_generations=4,
                             per_device_train_batch_size=8, report_to="none", bf16=False)
        with pytest.raises(DASEngineError, match="not a DAS engine|does not run the DAS drafter"):
            DASGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args,
                           train_dataset=load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0))
    finally:
        stop(process)
