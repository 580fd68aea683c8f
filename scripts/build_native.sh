#!/usr/bin/env bash
# Developer shortcut: rebuild the drafter's native core (das_trl/drafter/native, C++17 + nanobind) after changing
# its sources, by reinstalling this checkout in editable mode without dependencies or build isolation, so the CMake
# build in build/dev-<tag> is incremental. The package build itself is the standard one (pyproject.toml:
# scikit-build-core): `pip install .`, `pip install -e .` and `python -m build` compile the core without this script.
# Needs scikit-build-core, nanobind, cmake and ninja in the Python environment (scripts/setup_env.sh installs them)
# and a C++17 compiler. PYTHON selects the interpreter (default: .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
"$PY" -c "import scikit_build_core, nanobind" 2>/dev/null || {
  echo "[das-trl] build_native: scikit-build-core or nanobind is missing; run:" \
       "$PY -m pip install 'scikit-build-core>=0.11,<2' 'nanobind>=2.9.2,<3' cmake ninja" >&2; exit 1; }
# A module built in place by earlier versions of this script would only confuse: the installed one is used.
rm -f das_trl/drafter/native/_das_native*.so
"$PY" -m pip install --quiet --no-deps --no-build-isolation -e . \
  -Cbuild-dir="build/dev-{wheel_tag}"
SO="$("$PY" -c 'import glob, sysconfig
print(*glob.glob(sysconfig.get_paths()["platlib"] + "/das_trl/drafter/native/_das_native*.so"))')"
[ -n "$SO" ] || { echo "[das-trl] build_native: the build installed no _das_native module" >&2; exit 1; }
echo "[das-trl] native drafter core built: $SO"
