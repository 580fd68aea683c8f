#!/usr/bin/env bash
# The test suite: drafter unit tests, then the real CPU vLLM engine and real GRPO steps with the packaged model.
# Extra arguments go to pytest (e.g. -m "not engine and not trainer" for the fast tier only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export PATH="$PWD/.venv/bin:$PATH"
python -c "from das_trl.defaults.model import prepare_default_model; print(prepare_default_model())" >/dev/null
exec python -m pytest "$@"
