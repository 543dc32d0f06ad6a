#!/usr/bin/env bash
# `make bench`: runs every benchmark with its baseline in the same run and
# prints one table (median and p99, ratio against the baseline). The figures
# belong in docs/benchmarks.md with this command.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SANDMAN_ROOT"
go test -run '^$' -bench . -benchtime 2000x ./... 2>&1 | tee "${BENCH_OUT:-/dev/null}"
