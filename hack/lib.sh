# Shared helpers for hack/*.sh. Source it; it sets nothing but functions and
# the version pins that decide where cached binaries live.

SANDMAN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SANDMAN_CACHE=${SANDMAN_CACHE:-/var/cache/sandman}
SANDMAN_STATE=${SANDMAN_STATE:-/var/lib/sandman-local}

KUBE_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2
REGISTRY_VERSION=v3.1.2
RUNC_VERSION=v1.5.3
# gVisor from its Go module (the go branch): runsc and its containerd shim.
GVISOR_VERSION=v0.0.0-20260905035102-160fafc42237

KUBE_BIN=$SANDMAN_CACHE/kube-$KUBE_VERSION
CONTAINERD_BIN=$SANDMAN_CACHE/containerd-$CONTAINERD_VERSION
# -fs: our own main with the filesystem storage driver only (hack/tools/registry).
REGISTRY_BIN=$SANDMAN_CACHE/registry-$REGISTRY_VERSION-fs
# The runc that sandboxes run under (user namespaces need runc >= 1.2; Debian
# bookworm has 1.1.5). The node agent names it per container; the stack's
# containerd keeps the system runc for the kubelet's pods.
RUNC_BIN=$SANDMAN_CACHE/runc-$RUNC_VERSION/runc
# gVisor for pods with runtimeClassName gvisor (RuntimeClass handler runsc):
# runsc and containerd-shim-runsc-v1, which the node agent names by path.
GVISOR_DIR=$SANDMAN_CACHE/gvisor-$GVISOR_VERSION
RUNSC_BIN=$GVISOR_DIR/runsc
RUNSC_SHIM_BIN=$GVISOR_DIR/containerd-shim-runsc-v1
# The lazy-pulling snapshotter, from hack/tools/stargz's go.mod.
STARGZ_VERSION=v0.19.1
# Our own main (hack/tools/stargz): its cache entry changes with its source.
STARGZ_SRC=$(cat "$SANDMAN_ROOT"/hack/tools/stargz/{main.go,go.mod,go.sum} 2>/dev/null | sha256sum | cut -c1-8)
STARGZ_BIN=$SANDMAN_CACHE/stargz-$STARGZ_VERSION-$STARGZ_SRC/containerd-stargz-grpc
METRICS_SERVER_VERSION=v0.8.0
METRICS_SERVER_BIN=$SANDMAN_CACHE/metrics-server-$METRICS_SERVER_VERSION
METRICS_SERVER_PORT=14443
IMAGES_DIR=$SANDMAN_CACHE/images

# One build configuration for everything these scripts compile: the tools,
# the component images, the stack's binaries and every test tier (go vet,
# go test, the binaries tests build). Packages compiled once are then reused
# from GOCACHE by every later step; with the defaults (cgo on, full paths)
# the tests compiled sandman's dependencies a second time. runc, the one cgo
# build, sets CGO_ENABLED=1 itself.
export CGO_ENABLED=${CGO_ENABLED:-0}
case " ${GOFLAGS:-} " in *" -trimpath "*) ;; *) export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath" ;; esac

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# need CMD HINT: fail with a message naming the install step when CMD is missing.
need() {
	command -v "$1" >/dev/null 2>&1 || [ -x "$1" ] || die "$1 not found: run $2"
}

# Addresses of the local stack. Everything listens on loopback; slots live on
# the bridge below, in network namespaces the node agent makes.
APISERVER_PORT=${APISERVER_PORT:-16443}
ETCD_PORT=${ETCD_PORT:-12379}
REGISTRY_PORT=${REGISTRY_PORT:-15000}
SCHEDULER_PORT=${SCHEDULER_PORT:-20259}
CONTROLLER_MANAGER_PORT=${CONTROLLER_MANAGER_PORT:-20257}
SERVICE_CIDR=10.214.0.0/24
SERVICE_IP=10.214.0.1
BRIDGE=${BRIDGE:-sandman0}
BRIDGE_CIDR=${BRIDGE_CIDR:-10.213.0.0/16}
BRIDGE_IP=${BRIDGE_IP:-10.213.0.1}
CONTAINERD_ADDRESS=$SANDMAN_STATE/containerd/containerd.sock
# The lazy-pulling snapshotter's socket: containerd's proxy plugin "stargz".
STARGZ_ADDRESS=$SANDMAN_STATE/stargz/stargz.sock
# Its Prometheus metrics (node agents: --lazy-metrics-url).
STARGZ_METRICS_PORT=${STARGZ_METRICS_PORT:-15066}
CNI_CONF_DIR=$SANDMAN_STATE/cni/net.d
CNI_BIN_DIR=${CNI_BIN_DIR:-/usr/lib/cni}

# The real kubelet worker: the host itself, registered as node $WORKER_NAME at
# the bridge address. Its pods get addresses from the node's pod CIDR (given by
# kube-controller-manager out of $CLUSTER_CIDR) through a CNI config that
# containerd's CRI plugin writes from a template into $WORKER_CNI_CONF_DIR.
# The paths are the standard ones a worker has, so deploy/overlays/local
# mounts what an operator's workers would have.
WORKER_NAME=${WORKER_NAME:-sandman-worker}
CLUSTER_CIDR=${CLUSTER_CIDR:-10.216.0.0/13}
WORKER_BRIDGE=sandmanw0
WORKER_CNI_CONF_DIR=/etc/cni/net.d
WORKER_CNI_NETWORK=sandman-worker
KUBELET_PORT=11250
KUBELET_HEALTHZ_PORT=11248
KUBE_PROXY_METRICS_PORT=11249
KUBE_PROXY_HEALTHZ_PORT=11256
# The deployed node agent's host state (deploy/overlays/local).
NODE_AGENT_STATE=/var/lib/sandman-node

# Test task images, as pushed to the local registry.
BUSYBOX_REPO=sandman/busybox:1.35
NOSHELL_REPO=sandman/noshell:1
DEBIAN_REPO=sandman/debian:bookworm
E2B_BASE_REPO=sandman/e2b-base:bookworm

# kubeconfig NAME [CERT]: $SANDMAN_STATE/pki/NAME.kubeconfig for the client
# certificate CERT (default NAME) in that directory; kept if present.
kubeconfig() {
	local name=$1 cert=${2:-$1} pki=$SANDMAN_STATE/pki
	[ -f "$pki/$name.kubeconfig" ] && return
	cat >"$pki/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandman-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $pki/$cert.crt
    client-key: $pki/$cert.key
contexts:
- name: sandman-local
  context: {cluster: sandman-local, user: $name}
current-context: sandman-local
KC
}

# alive NAME: the process recorded for NAME runs.
alive() {
	local f=$SANDMAN_STATE/pids/$1.pid
	[ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

# stack_up: the local stack is up. The one rule every tier, make bench and
# e2e/framework (which runs this function) use: hack/local-up.sh finished
# (it writes stack.env last) and the kube-apiserver and containerd it
# recorded in pids/ still run. A caller that finds it down starts the stack
# with local-up.sh and stops it after; one that finds it up leaves it up.
stack_up() {
	[ -f "$SANDMAN_STATE/stack.env" ] && alive kube-apiserver && alive containerd
}

# start NAME CHECK CMD...: start CMD in the background unless NAME runs, then
# poll CHECK (a shell snippet) until it passes, the process dies or 60 s pass.
start() {
	local name=$1 check=$2
	shift 2
	if alive "$name"; then
		eval "$check" >/dev/null 2>&1 && { log "$name: already running"; return; }
	fi
	log "$name: starting"
	setsid "$@" >>"$SANDMAN_STATE/logs/$name.log" 2>&1 </dev/null &
	echo $! >"$SANDMAN_STATE/pids/$name.pid"
	local deadline=$((SECONDS + 60))
	until eval "$check" >/dev/null 2>&1; do
		if ! alive "$name"; then
			tail -n 20 "$SANDMAN_STATE/logs/$name.log" >&2
			die "$name exited; log: $SANDMAN_STATE/logs/$name.log"
		fi
		[ $SECONDS -lt $deadline ] || die "$name not ready after 60 s; log: $SANDMAN_STATE/logs/$name.log"
		sleep 0.2
	done
	log "$name: ready"
}
