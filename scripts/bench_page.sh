#!/usr/bin/env bash
# Regenerate the benchmarks page from one suite run: the replay suite's JSON (benchmarks/results/suite.json.gz), then
# the tables of docs/benchmarks.md, the README's headline block and the figures in docs/img/ (das-trl bench page).
#
#   bash scripts/bench_page.sh                    # the whole suite (about 5 minutes on 2 idle cores), then the page
#   bash scripts/bench_page.sh --page-only        # the page from the committed JSON (seconds)
#   SUITE_CACHE=/tmp/suite-cache bash scripts/bench_page.sh   # reuse the cost-independent drafters' results
#
# Further arguments go to `das-trl bench suite` (e.g. --das-config '{...}'). Environment: SUITE_JSON (default
# benchmarks/results/suite.json.gz), REALDATA (the third-party rollouts: ../shared/realdata where it exists, else
# built by scripts/fetch_realdata.sh into $DAS_TRL_CACHE/realdata, default ~/.cache/das-trl/realdata), SUITE_CACHE
# (a --cache folder: its results carry the CPU times of the run that wrote them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/das-trl ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
JSON="${SUITE_JSON:-benchmarks/results/suite.json.gz}"
if [ "${1:-}" != "--page-only" ]; then
    if [ -z "${REALDATA:-}" ] && [ -d ../shared/realdata ]; then
        REALDATA=../shared/realdata
    elif [ -z "${REALDATA:-}" ] || [ ! -d "$REALDATA" ]; then
        # download and convert (a set already there with its pinned sha256 is kept)
        REALDATA="${REALDATA:-${DAS_TRL_CACHE:-$HOME/.cache/das-trl}/realdata}"
        echo "bench_page.sh: building the third-party rollouts into $REALDATA (scripts/fetch_realdata.sh)" >&2
        bash scripts/fetch_realdata.sh --out "$REALDATA"
    fi
    # the default also under vLLM's padded logprob shape and with the prompts' admission (the page's engine table)
    das-trl bench suite --sets benchmarks/sets "$REALDATA" --c-tok 0.005 0.025 0.1 --json "$JSON" \
        --shapes patched,padded --admission trainer ${SUITE_CACHE:+--cache "$SUITE_CACHE"} "$@"
fi
das-trl bench page --json "$JSON" --pages docs/benchmarks.md benchmarks/realdata.md README.md --img docs/img
