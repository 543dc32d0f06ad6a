#!/usr/bin/env bash
# Regenerates the Go code of the envd protocol (daemon/envd/spec) from its
# .proto files. The generated files are committed: builds and CI never run
# this. Needs protoc (Debian's protobuf-compiler); the Go plugins are built
# at the versions go.mod pins, into the cache.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SANDMAN_ROOT"

command -v protoc >/dev/null || apt-get install -y protobuf-compiler
bin=$SANDMAN_CACHE/protoc-plugins
mkdir -p "$bin"
pb=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
cn=$(go list -m -f '{{.Version}}' connectrpc.com/connect)
GOBIN=$bin go install "google.golang.org/protobuf/cmd/protoc-gen-go@$pb"
GOBIN=$bin go install "connectrpc.com/connect/cmd/protoc-gen-connect-go@$cn"

spec=daemon/envd/spec
for p in process filesystem; do
	PATH=$bin:$PATH protoc -I "$spec" -I /usr/include \
		--go_out="$spec" --go_opt=paths=source_relative \
		--connect-go_out="$spec" --connect-go_opt=paths=source_relative \
		"$p/$p.proto"
done
log "generated: $(cd "$spec" && find . -name '*.go' | sort | tr '\n' ' ')"
