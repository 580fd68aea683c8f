"""Helpers for tests that start real ``das-trl serve`` / vLLM server processes (imported by test modules)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

# A small explicit KV cache (CPU builds count a memory *fraction* against the machine's RAM). `das-trl serve` runs the
# checkpoint's dtype (float32) by default; a plain vLLM server needs --dtype float32 (its 'auto' is bfloat16).
DAS_SERVER_ARGS = ["--max-model-len", "768", "--enforce-eager", "--kv-cache-memory-bytes", str(512 * 1024**2)]
SERVER_ARGS = ["--dtype", "float32", *DAS_SERVER_ARGS]


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (``int``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], port: int, env: dict | None = None) -> subprocess.Popen:
    """Start a server process and wait (up to 600 s) until ``/health`` answers on ``port``.

    Raises:
        RuntimeError: the process exited or did not become healthy in time (the process is killed).
    """
    from das_trl.vllm.serve import wait_for_server

    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_server(f"http://127.0.0.1:{port}", process, timeout=600)
    except Exception:
        process.kill()
        raise
    return process


def stop(process: subprocess.Popen) -> None:
    """Terminate a server process (kill it after 60 s)."""
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def start_das_server(model_path: str, num_speculative_tokens: int = 8,
                     extra: list[str] | None = None) -> tuple[str, subprocess.Popen]:
    """Start ``das-trl serve`` on a free port (``extra``: more flags for it) and wait until the drafter is attached.

    Returns:
        ``(base_url, process)``; stop it with :func:`stop`.
    """
    from das_trl.vllm.client import HTTPDASEngine

    port = free_port()
    command = [sys.executable, "-m", "das_trl.cli", "serve", "--model", model_path, "--port", str(port),
               "--num-speculative-tokens", str(num_speculative_tokens), *DAS_SERVER_ARGS, *(extra or [])]
    process = start(command, port)
    base_url = f"http://127.0.0.1:{port}"
    engine = HTTPDASEngine(base_url)
    # `das-trl serve` attaches after /health answers: wait for that too.
    for _ in range(60):
        if engine.stats().get("attached"):
            break
        time.sleep(1)
    return base_url, process


def server_mode_trainer(base_url: str, tmp_path, model_path: str, max_steps: int = 2):
    """A ``DASGRPOTrainer`` in server mode against ``base_url``: 2 gsm_symbolic problems x 4 samples per step,
    32-token completions at temperature 0.8, K = 8, ``max_steps`` steps, no checkpoints."""
    from das_trl.defaults.data import load_reasoning_gym_dataset
    from das_trl.defaults.rewards import DEFAULT_REWARD_FUNCS
    from das_trl.trainer import DASGRPOConfig, DASGRPOTrainer

    args = DASGRPOConfig(
        output_dir=str(tmp_path / "run"), use_vllm=True, vllm_mode="server", vllm_server_base_url=base_url,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=32, temperature=0.8,
        learning_rate=1e-5, beta=0.0, max_steps=max_steps, logging_steps=1, save_strategy="no", report_to="none",
        seed=0, bf16=False, das_num_speculative_tokens=8,
    )
    return DASGRPOTrainer(model=model_path, reward_funcs=DEFAULT_REWARD_FUNCS, args=args,
                          train_dataset=load_reasoning_gym_dataset("gsm_symbolic", size=2, seed=0))
