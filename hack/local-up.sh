#!/usr/bin/env bash
# Starts the real local stack: etcd, kube-apiserver (TLS, RBAC), kube-scheduler,
# kube-controller-manager, containerd (own root/state/socket, CRI disabled,
# overlayfs), a CNI bridge for slot networks, and a registry with the test task
# images. Everything listens on loopback or on the bridge this script creates.
# PIDs, logs, certificates and data live in $SANDMAN_STATE; `hack/local-down.sh`
# removes all of it. Running it again while the stack is up changes nothing.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root: containerd, network namespaces and the bridge need it"
for b in etcd kube-apiserver kube-scheduler kube-controller-manager kubectl; do
	need "$KUBE_BIN/$b" "hack/build-tools.sh (builds the pinned Kubernetes binaries)"
done
need "$CONTAINERD_BIN/containerd" "hack/build-tools.sh (builds containerd $CONTAINERD_VERSION)"
need "$REGISTRY_BIN/registry" "hack/build-tools.sh (builds the registry)"
need runc "hack/install-deps.sh"
need "$CNI_BIN_DIR/bridge" "hack/install-deps.sh (containernetworking-plugins)"
need curl "hack/install-deps.sh"
need ip "hack/install-deps.sh"

mkdir -p "$SANDMAN_STATE"/{pids,logs}
bash "$SANDMAN_ROOT/hack/pki.sh"
PKI=$SANDMAN_STATE/pki

# The bridge that slot network namespaces attach to, and the CNI config for it.
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
	log "bridge $BRIDGE: creating $BRIDGE_IP/${BRIDGE_CIDR#*/}"
	ip link add "$BRIDGE" type bridge
	ip addr add "$BRIDGE_IP/${BRIDGE_CIDR#*/}" dev "$BRIDGE"
fi
ip link set "$BRIDGE" up
KCURL=(curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")

start etcd "curl -fsS http://127.0.0.1:$ETCD_PORT/health" \
	"$KUBE_BIN/etcd" --name local --data-dir "$SANDMAN_STATE/etcd" \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
	--initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
	--initial-cluster "local=http://127.0.0.1:$((ETCD_PORT + 1))" \
	--unsafe-no-fsync --quota-backend-bytes 8589934592 --log-level warn

start kube-apiserver "${KCURL[*]} https://127.0.0.1:$APISERVER_PORT/readyz" \
	"$KUBE_BIN/kube-apiserver" \
	--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
	--bind-address 127.0.0.1 --advertise-address "$BRIDGE_IP" --secure-port "$APISERVER_PORT" \
	--endpoint-reconciler-type none \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
	--client-ca-file "$PKI/ca.crt" \
	--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
	--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP,Hostname \
	--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-cluster-ip-range "$SERVICE_CIDR" \
	--authorization-mode Node,RBAC --allow-privileged \
	--max-requests-inflight 2000 --max-mutating-requests-inflight 1000 \
	--profiling=false --v 1

start kube-scheduler "curl -fsSk https://127.0.0.1:$SCHEDULER_PORT/healthz" \
	"$KUBE_BIN/kube-scheduler" --kubeconfig "$PKI/scheduler.kubeconfig" \
	--authentication-kubeconfig "$PKI/scheduler.kubeconfig" --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false \
	--kube-api-qps 200 --kube-api-burst 400 --v 1

start kube-controller-manager "curl -fsSk https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz" \
	"$KUBE_BIN/kube-controller-manager" --kubeconfig "$PKI/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$PKI/controller-manager.kubeconfig" \
	--authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$CONTROLLER_MANAGER_PORT" --leader-elect=false \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
	--use-service-account-credentials --service-cluster-ip-range "$SERVICE_CIDR" \
	--kube-api-qps 200 --kube-api-burst 400 --v 1

mkdir -p "$CNI_CONF_DIR" "$SANDMAN_STATE/cni/ipam"
cat >"$CNI_CONF_DIR/10-sandman.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "sandman",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$SANDMAN_STATE/cni/ipam",
        "ranges": [[{"subnet": "$BRIDGE_CIDR", "gateway": "$BRIDGE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
CNI

mkdir -p "$SANDMAN_STATE/containerd"
cat >"$SANDMAN_STATE/containerd/config.toml" <<TOML
version = 3
root = "$SANDMAN_STATE/containerd/root"
state = "$SANDMAN_STATE/containerd/state"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images",
  "io.containerd.cri.v1.runtime",
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = "$CONTAINERD_ADDRESS"

[ttrpc]
  address = "$CONTAINERD_ADDRESS.ttrpc"

[metrics]
  address = "127.0.0.1:11338"

[plugins."io.containerd.internal.v1.opt"]
  path = "$SANDMAN_STATE/containerd/opt"
TOML
start containerd "$CONTAINERD_BIN/ctr --address $CONTAINERD_ADDRESS version" \
	env PATH="$CONTAINERD_BIN:$PATH" "$CONTAINERD_BIN/containerd" --config "$SANDMAN_STATE/containerd/config.toml" --log-level warn

mkdir -p "$SANDMAN_STATE/registry" "$SANDMAN_CACHE/registry-data"
cat >"$SANDMAN_STATE/registry/config.yml" <<YML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $SANDMAN_CACHE/registry-data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$REGISTRY_PORT
YML
start registry "curl -fsS http://127.0.0.1:$REGISTRY_PORT/v2/" \
	env OTEL_TRACES_EXPORTER=none "$REGISTRY_BIN/registry" serve "$SANDMAN_STATE/registry/config.yml"

bash "$SANDMAN_ROOT/hack/images.sh" push

cat >"$SANDMAN_STATE/stack.env" <<ENV
SANDMAN_STATE=$SANDMAN_STATE
KUBECONFIG=$PKI/admin.kubeconfig
KUBECTL=$KUBE_BIN/kubectl
CONTAINERD_ADDRESS=$CONTAINERD_ADDRESS
CTR=$CONTAINERD_BIN/ctr
REGISTRY=127.0.0.1:$REGISTRY_PORT
CNI_CONF_DIR=$CNI_CONF_DIR
CNI_BIN_DIR=$CNI_BIN_DIR
BRIDGE=$BRIDGE
BRIDGE_CIDR=$BRIDGE_CIDR
BRIDGE_IP=$BRIDGE_IP
REGISTRY_BIN=$REGISTRY_BIN/registry
BUSYBOX_IMAGE=127.0.0.1:$REGISTRY_PORT/$BUSYBOX_REPO
NOSHELL_IMAGE=127.0.0.1:$REGISTRY_PORT/$NOSHELL_REPO
DEBIAN_IMAGE=127.0.0.1:$REGISTRY_PORT/$DEBIAN_REPO
PKI=$PKI
ENV

cat >&2 <<MSG

The local stack is up (state, logs and pids in $SANDMAN_STATE).
  export KUBECONFIG=$PKI/admin.kubeconfig
  $KUBE_BIN/kubectl get --raw /readyz
  $CONTAINERD_BIN/ctr --address $CONTAINERD_ADDRESS namespaces ls
  curl http://127.0.0.1:$REGISTRY_PORT/v2/_catalog
Stop it with: make local-down (hack/local-down.sh)
MSG
