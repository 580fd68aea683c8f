#!/usr/bin/env bash
# Build the drafter's native core (das_trl/drafter/native, C++17 + nanobind) in place, from source.
# Needs cmake, ninja and nanobind in the Python environment (scripts/setup_env.sh installs them) and a C++17 compiler.
# PYTHON selects the interpreter (default: .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
SRC=das_trl/drafter/native
BUILD="${DAS_TRL_NATIVE_BUILD_DIR:-build/native}"
NB_DIR="$("$PY" -m nanobind --cmake_dir)" || {
  echo "[das-trl] build_native: nanobind is missing; run: $PY -m pip install nanobind==2.9.2 cmake ninja" >&2; exit 1; }
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -Dnanobind_DIR="$NB_DIR" \
  -DPython_EXECUTABLE="$("$PY" -c 'import sys; print(sys.executable)')" >/dev/null
cmake --build "$BUILD" --parallel "${DAS_TRL_BUILD_JOBS:-2}"
ls "$SRC"/_das_native*.so >/dev/null
echo "[das-trl] native drafter core built: $(ls "$SRC"/_das_native*.so)"
