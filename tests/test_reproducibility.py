"""Two short runs of the main job's recipe with the same seed give the same rollouts (token ids) at every step.

Drafts change which random draws vLLM's rejection sampler consumes, so any timing that reaches a draft makes two runs
sample differently even though each is lossless. Nothing measured may steer the drafts by default: the controller
prices steps with its configured cost model (the online fit is opt-in), decides from fixed stratified samples, and
the proposer swaps a pushed history in at the first engine step after the push, not when its build happens to end.
Real: the recipe (`recipes/grpo_das.py` with `recipes/configs/embedded_default.yaml`) under `accelerate launch`, as
`scripts/main_job.sh` runs it, with drafts accepted in both runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


def _run(out: Path) -> dict[int, list[list[int]]]:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
           "--num_cpu_threads_per_process", "1", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", str(ROOT / "recipes" / "grpo_das.py"),
           "--config", str(ROOT / "recipes" / "configs" / "embedded_default.yaml"), "--max_steps", str(STEPS),
           "--output_dir", str(out), "--das_record_rollouts", str(out / "rollouts.jsonl")]
    # A clean launch, as scripts/main_job.sh's: earlier in-process trainer tests leave their process group's
    # RANK / LOCAL_RANK / WORLD_SIZE / MASTER_* (still bound) in os.environ.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**env, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    by_step: dict[int, list[list[int]]] = defaultdict(list)
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_step[rec["step"]].append(rec["prompt_ids"] + [-1] + rec["completion_ids"])
    accepted = [line for line in proc.stdout.splitlines() if "drafts:" in line and " 0 accepted" not in line]
    assert accepted, "no step accepted a draft: the runs would agree without speculation mattering"
    return by_step


def test_two_runs_with_the_same_seed_give_the_same_rollouts(tmp_path):
    first, second = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert sorted(first) == sorted(second) and len(first) == STEPS
    for step in sorted(first):
        assert first[step] == second[step], f"step {step}: the rollouts differ"
