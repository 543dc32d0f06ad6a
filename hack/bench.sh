#!/usr/bin/env bash
# `make bench`: runs every benchmark suite with its baseline measured in the
# same run and prints one table (median and p99, ratio against the
# baseline). BENCH_SUITE picks suites (default all), BENCH_N the iterations.
# The figures belong in docs/benchmarks.md with this command.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SANDMAN_ROOT"
go run ./hack/bench -suite "${BENCH_SUITE:-all}" -n "${BENCH_N:-500}" -out "${BENCH_OUT:-/tmp/sandman-bench.md}"
