#!/usr/bin/env bash
# `make bench`: runs every benchmark suite with its baseline measured in the
# same run and prints one table (median and p99, ratio against the
# baseline). BENCH_SUITE picks suites (default all: daemon, node, vk, image;
# the scale suite takes many minutes and runs only when named:
# BENCH_SUITE=scale, sized by BENCH_SCALE_* — see hack/bench/scale.go; so does
# the deploy suite, which installs deploy/overlays/local: BENCH_SUITE=deploy;
# and the snapshot suite of prepared environments, about 2.5 minutes:
# BENCH_SUITE=snapshot; and the hot suite, issue 16's mixed burst per hot
# budget, ~10 minutes: BENCH_SUITE=hot, sized by BENCH_HOT_* — see
# hack/bench/hot.go),
# BENCH_N the iterations, BENCH_NODE_MEMORY_ONLY=1 only the node suite's memory rows,
# BENCH_OUT where the markdown table is also written. Suites that need the
# local stack get one: a running stack is reused, one started here is
# stopped at the end. The figures belong in docs/benchmarks.md with this
# command.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SANDMAN_ROOT"

suite=${BENCH_SUITE:-all}
if [ "$suite" != daemon ]; then
	if ! [ -f "$SANDMAN_STATE/stack.env" ] || ! kill -0 "$(cat "$SANDMAN_STATE/pids/containerd.pid" 2>/dev/null)" 2>/dev/null; then
		trap 'bash hack/local-down.sh' EXIT
	fi
	bash hack/local-up.sh
fi
go run ./hack/bench -suite "$suite" -n "${BENCH_N:-500}" -out "${BENCH_OUT:-/tmp/sandman-bench.md}"
