#!/usr/bin/env bash
# `make soak` (issue 17), not part of `make test`: the soak on the real
# stack. TestSoakChurn runs SOAK_DURATION (default 30m) of trainer-like
# churn while sandman-vk, a node agent, containerd, kube-apiserver and etcd
# are killed and restarted one at a time and a node agent is stopped for
# longer than the pool's bind timeout; TestSoakCycles binds and releases
# SOAK_CYCLES (default 10000; 0 skips it) times on one node agent. Both
# write SOAK_REPORT (default docs/reliability.md) with their SVG plots beside
# it; raw data and logs go to $SANDMAN_STATE/test-artifacts/soak-*.
# SOAK_SEED (drawn here when unset, and printed) repeats a run's decisions.
# Other knobs: SOAK_AGENTS, SOAK_SLOTS, SOAK_FAULTS (vk,agent,containerd,
# apiserver,etcd,agent-stop), SOAK_FAULT_REPEATS, SOAK_STOP_REPEATS,
# SOAK_SAMPLE_INTERVAL, SOAK_CREATE_INTERVAL, SOAK_TIMEOUT (go test's).
# A running stack is reused, else one is started for the run and stopped
# after (framework.Main; SANDMAN_KEEP_STACK=1 keeps it). The soak kills
# the stack's processes: run nothing else against the stack meanwhile.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SANDMAN_ROOT"

[ "$(id -u)" = 0 ] || die "run as root: the soak drives the local stack (containerd, network namespaces)"

export SOAK_DURATION=${SOAK_DURATION:-30m}
export SOAK_CYCLES=${SOAK_CYCLES:-10000}
export SOAK_SEED=${SOAK_SEED:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}
export SOAK_REPORT=${SOAK_REPORT:-$SANDMAN_ROOT/docs/reliability.md}
SOAK_LOG=${SOAK_LOG:-/tmp/sandman-soak.log}

# minutes DURATION: a Go duration made of h, m and s (30m, 1h30m, 90s) in
# whole minutes, rounded up.
minutes() {
	local d=$1 total=0 n unit
	while [[ $d =~ ^([0-9]+)([hms])(.*)$ ]]; do
		n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]} d=${BASH_REMATCH[3]}
		case $unit in
		h) total=$((total + n * 3600)) ;;
		m) total=$((total + n * 60)) ;;
		s) total=$((total + n)) ;;
		esac
	done
	if [ -n "$d" ] || [ "$total" = 0 ]; then
		die "SOAK_DURATION=$1: write it with h, m and s (30m, 1h30m)"
	fi
	echo $(((total + 59) / 60))
}
[[ $SOAK_CYCLES =~ ^[0-9]+$ ]] || die "SOAK_CYCLES=$SOAK_CYCLES: a number of cycles"

# go test's timeout: the churn (its duration, set-up, at most 20 min of
# drain and 12 of settling) and the cycles (a bind costs ~240 ms on 2 cores,
# so 4 at a time make perhaps 2-4 cycles/s; 12 min per 1,000 leaves room).
# The cycles stop 5 min before the timeout and still report how far they
# got; the report gives the rate, to size SOAK_TIMEOUT for the next run.
churn_minutes=$(minutes "$SOAK_DURATION")
thousands=$(((SOAK_CYCLES + 999) / 1000))
timeout=${SOAK_TIMEOUT:-$((churn_minutes + 40 + thousands * 12 + 10))m}

log "soak: SOAK_DURATION=$SOAK_DURATION SOAK_CYCLES=$SOAK_CYCLES SOAK_SEED=$SOAK_SEED, go test -timeout $timeout"
log "soak: verbose log in $SOAK_LOG; the report will be $SOAK_REPORT"
set +o errexit
go test -count=1 -v -tags e2e,soak -run '^TestSoak' -timeout "$timeout" ./e2e/ 2>&1 | tee "$SOAK_LOG" |
	grep --line-buffered -E 'soak|^\s*--- |^(ok|FAIL|PASS)|framework:|panic'
st=${PIPESTATUS[0]}
set -o errexit
echo "soak report: $SOAK_REPORT (plots beside it); verbose log: $SOAK_LOG; repeat with SOAK_SEED=$SOAK_SEED"
exit "$st"
