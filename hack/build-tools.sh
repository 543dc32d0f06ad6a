#!/usr/bin/env bash
# Builds the local stack's pinned binaries into a cache outside the repo:
#   etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
#     from k8s.io/kubernetes (hack/tools/kube, staging modules at v0.37.2);
#   containerd and containerd-shim-runc-v2 from the containerd module version
#     that sandman's client uses;
#   registry from github.com/distribution/distribution/v3 (hack/tools/registry:
#     the filesystem and in-memory storage drivers only);
#   runc from github.com/opencontainers/runc (cgo, with seccomp: needs
#     libseccomp-dev from hack/install-deps.sh);
#   runsc and containerd-shim-runsc-v1 from gvisor.dev/gvisor (the go branch);
#   containerd-stargz-grpc, the lazy-pulling snapshotter, from
#     stargz-snapshotter's library (hack/tools/stargz: a main of our own).
# Everything comes through the Go module proxy. Work already done is skipped;
# the first run takes ~15 minutes on 2 cores.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need go "apt-get install golang (Go 1.26 is expected at /usr/local/go)"

LDFLAGS="-s -w"

# kube_ldflags: the version stamp Kubernetes' own build gives its binaries
# (hack/lib/version.sh in kubernetes), for both version packages. Without it
# they report v0.0.0-master+$Format:%H$, which `kubectl version` cannot parse.
# The commit is not known from the module, so it is left empty; the build
# date is the release's, from the module proxy, so builds stay reproducible.
kube_ldflags() {
	local v=${KUBE_VERSION#v} date flags=""
	local major=${v%%.*} minor=${v#*.}
	minor=${minor%%.*}
	date=$(cd "$SANDMAN_ROOT/hack/tools/kube" &&
		go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes) ||
		die "cannot read the release date of k8s.io/kubernetes $KUBE_VERSION"
	for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
		flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major"
		flags+=" -X $pkg.gitMinor=$minor -X $pkg.gitCommit= -X $pkg.gitTreeState=clean"
		flags+=" -X $pkg.buildDate=$date"
	done
	echo "${flags# }"
}

# Binaries built before they were stamped have no $KUBE_BIN/.stamped and are
# all rebuilt once.
build_kube() {
	local want=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy) missing=()
	if [ -f "$KUBE_BIN/.stamped" ]; then
		for b in "${want[@]}"; do [ -x "$KUBE_BIN/$b" ] || missing+=("$b"); done
	else
		missing=("${want[@]}")
	fi
	if [ ${#missing[@]} -eq 0 ]; then log "kubernetes $KUBE_VERSION: cached in $KUBE_BIN"; return; fi
	log "kubernetes $KUBE_VERSION: building ${missing[*]} into $KUBE_BIN (first build ~12 minutes)"
	local ldflags
	ldflags="$LDFLAGS $(kube_ldflags)"
	mkdir -p "$KUBE_BIN.tmp"
	(
		cd "$SANDMAN_ROOT/hack/tools/kube"
		for b in "${missing[@]}"; do
			local pkg=k8s.io/kubernetes/cmd/$b
			[ "$b" = etcd ] && pkg=./cmd/etcd
			log "  go build $pkg"
			CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$KUBE_BIN.tmp/$b" "$pkg"
		done
	)
	mkdir -p "$KUBE_BIN"
	mv "$KUBE_BIN.tmp"/* "$KUBE_BIN"/ && rmdir "$KUBE_BIN.tmp"
	touch "$KUBE_BIN/.stamped"
}

build_containerd() {
	if [ -x "$CONTAINERD_BIN/containerd" ] && [ -x "$CONTAINERD_BIN/containerd-shim-runc-v2" ]; then
		log "containerd $CONTAINERD_VERSION: cached in $CONTAINERD_BIN"; return
	fi
	log "containerd $CONTAINERD_VERSION: building into $CONTAINERD_BIN (~3 minutes)"
	mkdir -p "$CONTAINERD_BIN"
	local m=github.com/containerd/containerd/v2
	GOBIN=$CONTAINERD_BIN CGO_ENABLED=0 go install -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
		-ldflags "$LDFLAGS -X $m/version.Version=$CONTAINERD_VERSION" \
		"$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" "$m/cmd/ctr@$CONTAINERD_VERSION"
}

# The registry from our own main (hack/tools/registry): the upstream command
# tree with the filesystem and in-memory storage drivers only, so none of the
# cloud storage SDKs is built. Same CLI: `registry serve CONFIG`.
build_registry() {
	if [ -x "$REGISTRY_BIN/registry" ]; then log "registry $REGISTRY_VERSION: cached in $REGISTRY_BIN"; return; fi
	log "registry $REGISTRY_VERSION: building into $REGISTRY_BIN (~1 minute)"
	mkdir -p "$REGISTRY_BIN"
	(
		cd "$SANDMAN_ROOT/hack/tools/registry"
		CGO_ENABLED=0 go build \
			-ldflags "$LDFLAGS -X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION" \
			-o "$REGISTRY_BIN/registry.tmp" .
	)
	mv "$REGISTRY_BIN/registry.tmp" "$REGISTRY_BIN/registry"
}

# runc for the sandboxes, as runc's Makefile builds it (seccomp, PIE) less the
# libpathrs tag (a Rust library Debian does not ship: runc then uses its pure Go
# path resolution). It links libseccomp dynamically, as Debian's runc does.
build_runc() {
	if [ -x "$RUNC_BIN" ]; then log "runc $RUNC_VERSION: cached in $RUNC_BIN"; return; fi
	[ -f /usr/include/seccomp.h ] || die "libseccomp-dev not installed: run hack/install-deps.sh"
	log "runc $RUNC_VERSION: building into $RUNC_BIN (~2 minutes)"
	local dir tmp
	dir=$(dirname "$RUNC_BIN")
	tmp=$(mktemp -d)
	mkdir -p "$dir"
	GOBIN=$tmp CGO_ENABLED=1 go install -buildmode=pie -tags "seccomp urfave_cli_no_docs" \
		-ldflags "$LDFLAGS -X main.gitCommit=$RUNC_VERSION" \
		"github.com/opencontainers/runc@$RUNC_VERSION"
	mv "$tmp/runc" "$RUNC_BIN" && rmdir "$tmp"
}

# gVisor for sandboxes of RuntimeClass handler runsc: runsc and its containerd
# shim from gvisor.dev/gvisor's go branch, pure Go (no cgo), ~2 minutes.
build_gvisor() {
	if [ -x "$RUNSC_BIN" ] && [ -x "$RUNSC_SHIM_BIN" ]; then log "gVisor $GVISOR_VERSION: cached in $GVISOR_DIR"; return; fi
	log "gVisor $GVISOR_VERSION: building runsc and containerd-shim-runsc-v1 into $GVISOR_DIR (~2 minutes)"
	local tmp
	tmp=$(mktemp -d)
	mkdir -p "$GVISOR_DIR"
	GOBIN=$tmp CGO_ENABLED=0 go install -ldflags "$LDFLAGS" \
		"gvisor.dev/gvisor/runsc@$GVISOR_VERSION" "gvisor.dev/gvisor/shim@$GVISOR_VERSION"
	mv "$tmp/runsc" "$RUNSC_BIN" && mv "$tmp/shim" "$RUNSC_SHIM_BIN" && rmdir "$tmp"
}

# metrics-server for `kubectl top` (hack/metrics-server.sh). Its own module
# (hack/tools/metrics-server) with metrics-server's k8s.io versions, not the
# stack's: built against the stack's v0.37.2 it compiles, but panics at
# start ("cannot find model definition for
# io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics": its generated
# OpenAPI names predate those k8s.io/apiserver v0.37 looks up).
build_metrics_server() {
	if [ -x "$METRICS_SERVER_BIN/metrics-server" ]; then
		log "metrics-server $METRICS_SERVER_VERSION: cached in $METRICS_SERVER_BIN"; return
	fi
	log "metrics-server $METRICS_SERVER_VERSION: building into $METRICS_SERVER_BIN"
	mkdir -p "$METRICS_SERVER_BIN"
	(
		cd "$SANDMAN_ROOT/hack/tools/metrics-server"
		CGO_ENABLED=0 go build -ldflags "$LDFLAGS -X k8s.io/client-go/pkg/version.gitVersion=$METRICS_SERVER_VERSION" \
			-o "$METRICS_SERVER_BIN/metrics-server.tmp" sigs.k8s.io/metrics-server/cmd/metrics-server
	)
	mv "$METRICS_SERVER_BIN/metrics-server.tmp" "$METRICS_SERVER_BIN/metrics-server"
}

# stargz-snapshotter's containerd-stargz-grpc from our own main
# (hack/tools/stargz): upstream's command module is not in the module proxy.
build_stargz() {
	if [ -x "$STARGZ_BIN" ]; then log "stargz-snapshotter $STARGZ_VERSION: cached in $(dirname "$STARGZ_BIN")"; return; fi
	log "stargz-snapshotter $STARGZ_VERSION: building containerd-stargz-grpc (~1 minute)"
	mkdir -p "$(dirname "$STARGZ_BIN")"
	(
		cd "$SANDMAN_ROOT/hack/tools/stargz"
		CGO_ENABLED=0 go build -ldflags "$LDFLAGS" -o "$STARGZ_BIN.tmp" .
	)
	mv "$STARGZ_BIN.tmp" "$STARGZ_BIN"
}

case "${1:-all}" in
all) build_containerd; build_runc; build_gvisor; build_registry; build_stargz; build_kube; build_metrics_server ;;
stargz) build_stargz ;;
kube) build_kube ;;
containerd) build_containerd ;;
registry) build_registry ;;
runc) build_runc ;;
gvisor) build_gvisor ;;
metrics-server) build_metrics_server ;;
*) die "usage: $0 [all|kube|containerd|runc|gvisor|registry|stargz|metrics-server]" ;;
esac
log "tools ready under $SANDMAN_CACHE"
