#!/usr/bin/env bash
# Regenerate the benchmarks page from one suite run: the replay suite's JSON (benchmarks/results/suite.json.gz), then
# the tables of docs/benchmarks.md, the README's headline block and the figures in docs/img/ (das-trl bench page).
#
#   bash scripts/bench_page.sh                    # the whole suite (tens of minutes on 2 cores), then the page
#   bash scripts/bench_page.sh --page-only        # the page from the committed JSON (seconds)
#   SUITE_CACHE=/tmp/suite-cache bash scripts/bench_page.sh   # reuse the cost-independent drafters' results
#
# Further arguments go to `das-trl bench suite` (e.g. --das-config '{...}'). Environment: SUITE_JSON (default
# benchmarks/results/suite.json.gz), REALDATA (default ../shared/realdata, the third-party rollouts), SUITE_CACHE
# (a --cache folder: its results carry the CPU times of the run that wrote them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/das-trl ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
JSON="${SUITE_JSON:-benchmarks/results/suite.json.gz}"
REALDATA="${REALDATA:-../shared/realdata}"
if [ "${1:-}" != "--page-only" ]; then
    if [ ! -d "$REALDATA" ]; then
        echo "bench_page.sh: $REALDATA not found (the third-party rollouts; set REALDATA=DIR)" >&2
        exit 2
    fi
    das-trl bench suite --sets benchmarks/sets "$REALDATA" --c-tok 0.005 0.025 0.1 --json "$JSON" \
        ${SUITE_CACHE:+--cache "$SUITE_CACHE"} "$@"
fi
das-trl bench page --json "$JSON" --pages docs/benchmarks.md README.md --img docs/img
