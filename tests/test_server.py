"""Server mode: ``das-trl serve`` (vLLM's OpenAI server + DAS), TRL's client, and DASGRPOTrainer over HTTP.

Also: a plain vLLM server (dev mode, no DAS) is reported as "not a DAS engine" at trainer start, not as a hang, with
the commands that start a DAS server in its place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from server_utils import SERVER_ARGS, free_port, server_mode_trainer, start, start_das_server, stop

pytestmark = [pytest.mark.engine, pytest.mark.trainer]

ROOT = Path(__file__).resolve().parents[1]


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
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine(das_server)
    engine.reset("all")
    trainer = server_mode_trainer(das_server, tmp_path, model_path, max_steps=2)
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
        with pytest.raises(DASEngineError, match="not a DAS engine|does not run the DAS drafter") as info:
            DASGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args,
                           train_dataset=load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0))
        # The refusal names the commands that start a DAS server for this model and port.
        message = str(info.value)
        assert f"`das-trl serve --model {model_path} --port {port}`" in message, message
        assert "trl vllm-serve --model" in message and "--speculative-config" in message, message
    finally:
        stop(process)


def test_image_prompt_endpoints_serve_trl_feature_path(das_server, model_path):
    """TRL's client sends image prompts (and the text prompts of a batch that has one) to the render and generate
    endpoints: ``das-trl serve`` enables them (vLLM answers 403 otherwise) and the trainer's client parses the
    replies. Only the endpoints and the text path are exercised here: the packaged model takes no images."""
    import requests

    from das_trl.trainer.trl_client import DASVLLMClient

    render = requests.post(f"{das_server}/v1/chat/completions/render", timeout=60, json={
        "model": model_path, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert render.status_code == 200, render.text
    client = DASVLLMClient(base_url=das_server, connection_timeout=10)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    out = client.generate(prompts, features=[None, None], n=2, temperature=0.8, max_tokens=8, logprobs=0)
    assert out["prompt_ids"] == prompts and len(out["completion_ids"]) == 4
    assert [len(lp) for lp in out["logprobs"]] == [len(c) for c in out["completion_ids"]]
    assert [[ids[0] for ids in per_token] for per_token in out["logprob_token_ids"]] == out["completion_ids"]


def test_two_process_server_run_pushes_each_rollout_once_and_restores(das_server, tmp_path, model_path):
    """Two training processes (DDP on CPU, the launch DeepSpeed / FSDP users take) against one ``das-trl serve``:
    both processes' rollouts reach the history exactly once (the checkpoint's mirror digest equals the engine's),
    step 2 drafts from step 1's history, and the two-process checkpoint restores the history into the engine."""
    from das_trl.defaults.data import load_reasoning_gym_dataset
    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOConfig, DASGRPOTrainer
    from das_trl.trainer.callback import DASHistoryMirror
    from das_trl.vllm.client import HTTPDASEngine

    engine = HTTPDASEngine(das_server)
    engine.reset("all")
    out = tmp_path / "run"
    # 2 problems x 4 samples per step = 4 completions per process; 2 steps; checkpoint at step 2 (model only). SGD keeps
    # each training process at ~2.7 GB instead of ~3.7 GB with AdamW's states (the optimizer is not what is tested).
    command = [sys.executable, "-m", "accelerate.commands.launch",
               "--config_file", str(ROOT / "recipes" / "accelerate" / "cpu_ddp.yaml"),
               str(ROOT / "recipes" / "grpo_das.py"),
               "--use_cpu", "true", "--model_name_or_path", model_path, "--dataset", "rg:gsm_symbolic",
               "--dataset_size", "2", "--output_dir", str(out), "--use_vllm", "true", "--vllm_mode", "server",
               "--vllm_server_base_url", das_server, "--num_generations", "4", "--per_device_train_batch_size", "4",
               "--max_completion_length", "32", "--temperature", "0.8", "--learning_rate", "1e-5", "--beta", "0",
               "--max_steps", "2", "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "2",
               "--save_only_model", "true", "--optim", "sgd", "--report_to", "none", "--seed", "0", "--bf16", "false",
               "--das_num_speculative_tokens", "8"]
    result = subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    checkpoint = out / "checkpoint-2"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    logs = [h for h in state["log_history"] if "das/rollout_seconds" in h]
    assert len(logs) == 2 and logs[0]["epoch"] == 1.0, logs  # one step covers both processes' problems

    # Exactly once: 2 steps x 2 processes x 4 completions; no push had to be repaired; mirror == engine.
    stats = engine.stats()
    assert stats["history_sequences"] == 16 and stats["history_problems"] == 2, stats
    assert all(h.get("das/history_repairs", 0.0) == 0.0 for h in logs), logs
    mirror = DASHistoryMirror(16, 8_000_000)
    assert mirror.load(str(checkpoint))
    assert engine.history_digests() == [mirror.digest()]
    # Step 2 drafted from step 1's rollouts.
    assert logs[1]["das/accepted_tokens"] > 0 and stats.get("source_problem", 0) > 0, (logs[1], stats)

    # The two-process checkpoint restores the history (the trainer's resume path) into a cleared engine.
    engine.reset("history")
    assert engine.history_digests() != [mirror.digest()]
    args = DASGRPOConfig(output_dir=str(tmp_path / "resume"), use_vllm=True, vllm_mode="server",
                         vllm_server_base_url=das_server, num_generations=4, per_device_train_batch_size=8,
                         report_to="none", bf16=False, das_num_speculative_tokens=8)
    trainer = DASGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args,
                             train_dataset=load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0))
    assert trainer.das_restore_history(str(checkpoint)) is True
    assert engine.history_digests() == [mirror.digest()]
    assert engine.stats()["history_sequences"] == 16
