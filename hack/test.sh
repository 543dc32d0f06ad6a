#!/usr/bin/env bash
# The README's test command (`make test`): installs what the tests need, then
# runs lint, the unit tier, the root tier and the e2e tier against one local
# stack. A stack that was already running is reused and left running; one
# started here is stopped at the end, whatever the outcome.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SANDMAN_ROOT"

bash hack/install-deps.sh
bash hack/build-tools.sh
bash hack/images.sh build

log "lint"
make --no-print-directory lint
log "unit tests"
make --no-print-directory test-unit

started=0
if ! [ -f "$SANDMAN_STATE/stack.env" ] || ! kill -0 "$(cat "$SANDMAN_STATE/pids/kube-apiserver.pid" 2>/dev/null)" 2>/dev/null; then
	started=1
	trap 'bash hack/local-down.sh' EXIT
fi
bash hack/local-up.sh
log "root tier"
go test -count=1 -p 1 -tags root -run '^TestRoot' ./...
log "e2e tier"
go test -count=1 -p 1 -tags e2e -timeout 30m ./e2e/...
log "all tiers passed"
