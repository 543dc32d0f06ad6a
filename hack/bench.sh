#!/usr/bin/env bash
# `make bench`: runs benchmark suites, each with its baseline measured in
# the same run, and prints one table (median and p99, ratio against the
# baseline). BENCH_SUITE picks suites, comma-separated (hack/bench/main.go
# registers them and says which all runs; `go run ./hack/bench -help`
# describes each):
#   all, the default: daemon,node,vk,image,e2b
#   named only: hostile,failover,hot,deploy,snapshot,pause,move,lazy,scale — they take minutes
#   (hot ~10, sized by BENCH_HOT_*; scale many, sized by BENCH_SCALE_*;
#   snapshot ~2.5) or change the stack (deploy installs
#   deploy/overlays/local; failover kills sandman-vk leaders).
# BENCH_N the iterations, BENCH_NODE_MEMORY_ONLY=1 only the node suite's
# memory rows, BENCH_OUT where the markdown table is also written. Suites
# that need the local stack get one: a stack that is up (hack/lib.sh
# stack_up) is reused, one started here is stopped at the end. The figures
# belong in docs/benchmarks.md with this command.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SANDMAN_ROOT"

suite=${BENCH_SUITE:-all}
if [ "$suite" != daemon ]; then
	stack_up || trap 'bash hack/local-down.sh' EXIT
	bash hack/local-up.sh
fi
go run ./hack/bench -suite "$suite" -n "${BENCH_N:-500}" -out "${BENCH_OUT:-/tmp/sandman-bench.md}"
