#!/usr/bin/env bash
# The main job: a real GRPO run of the embedded default (SmolLM2-135M-Instruct on reasoning-gym 1-digit products) with
# rollouts from a vLLM engine running the DAS drafter. Extra arguments go to the recipe (TRL-style flags).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export PATH="$PWD/.venv/bin:$PATH"
python -c "from das_trl.defaults.model import prepare_default_model; print(prepare_default_model())" >/dev/null
# One OpenMP thread: the colocated CPU engine pins its threads, and extra OpenMP threads contending for a pinned core
# made rollouts ~10x slower here.
exec accelerate launch --cpu --num_processes 1 --num_cpu_threads_per_process 1 --num_machines 1 --mixed_precision no \
  --dynamo_backend no \
  recipes/grpo_das.py --config recipes/configs/embedded_default.yaml "$@"
