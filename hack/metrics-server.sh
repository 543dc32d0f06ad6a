#!/usr/bin/env bash
# Runs metrics-server (built by hack/build-tools.sh) in the local stack, so that
# `kubectl top node` and `kubectl top pod` work against the kubelet worker and
# the virtual node. metrics-server runs as a host process on the bridge address
# (an EndpointSlice cannot point at loopback); the apiserver reaches it through
# the aggregation layer with --enable-aggregator-routing.
#
#   hack/metrics-server.sh pki   certificates only, into $SANDMAN_STATE/pki: the
#                                front-proxy CA and the apiserver's proxy client
#                                certificate (kube-apiserver's flags name them,
#                                so this runs before the apiserver starts), the
#                                serving certificate and the client identity
#   hack/metrics-server.sh up    pki, RBAC, Service, EndpointSlice, APIService,
#                                the process; waits until the APIService is
#                                Available
#   hack/metrics-server.sh down  stops the process and removes the APIService
#   hack/metrics-server.sh apiserver-flags
#                                the kube-apiserver flags the aggregation layer
#                                needs, one a line
#
# Existing files and objects are kept or re-applied: running it again while it
# is up changes nothing.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PKI=$SANDMAN_STATE/pki

# The apiserver flags for the aggregation layer (front-proxy client
# certificate, request-header authentication, routing to the endpoint IP).
apiserver_flags() {
	printf '%s\n' \
		"--requestheader-client-ca-file=$PKI/front-proxy-ca.crt" \
		"--requestheader-allowed-names=front-proxy-client" \
		"--requestheader-extra-headers-prefix=X-Remote-Extra-" \
		"--requestheader-group-headers=X-Remote-Group" \
		"--requestheader-username-headers=X-Remote-User" \
		"--proxy-client-cert-file=$PKI/front-proxy-client.crt" \
		"--proxy-client-key-file=$PKI/front-proxy-client.key" \
		"--enable-aggregator-routing=true"
}

# sign NAME SUBJECT CA EXT: a key and a certificate for SUBJECT signed by CA
# (CA.crt, CA.key) with the openssl extensions EXT. Kept when present.
sign() {
	local name=$1 subj=$2 ca=$3 ext=$4 extfile
	[ -f "$name.crt" ] && return
	openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$name.key" -out "$name.csr" 2>/dev/null
	extfile=$(mktemp)
	printf '%b\n' "$ext" >"$extfile"
	openssl x509 -req -in "$name.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial -days 3650 \
		-extfile "$extfile" -out "$name.crt" 2>/dev/null
	rm -f "$name.csr" "$extfile"
}

pki() {
	need openssl "hack/install-deps.sh"
	{ [ -f "$PKI/ca.crt" ] && [ -f "$PKI/ca.key" ]; } || die "no cluster CA in $PKI: run hack/pki.sh first"
	(
		cd "$PKI"
		# The aggregation layer's own CA: metrics-server trusts request headers
		# only from clients it signed, which is the apiserver alone.
		if [ ! -f front-proxy-ca.crt ]; then
			openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=sandman-front-proxy-ca" \
				-keyout front-proxy-ca.key -out front-proxy-ca.crt 2>/dev/null
		fi
		sign front-proxy-client "/CN=front-proxy-client" front-proxy-ca 'extendedKeyUsage=clientAuth'
		# The apiserver dials the endpoint IP but checks the name
		# <service>.<namespace>.svc (the APIService's caBundle is the cluster CA).
		sign metrics-server "/CN=metrics-server" ca \
			"subjectAltName=IP:$BRIDGE_IP,DNS:metrics-server.kube-system.svc,DNS:metrics-server.kube-system.svc.cluster.local,DNS:metrics-server.kube-system,DNS:metrics-server\nextendedKeyUsage=serverAuth"
		# One identity towards the apiserver and the kubelets.
		sign metrics-server-client "/CN=system:metrics-server" ca 'extendedKeyUsage=clientAuth'
		kubeconfig metrics-server metrics-server-client
		chmod 600 front-proxy-ca.key front-proxy-client.key metrics-server.key metrics-server-client.key
	)
}

# The objects upstream's manifests/base make, for the user system:metrics-server
# (this stack's client certificate) instead of a ServiceAccount, and a Service
# without selector whose EndpointSlice is the host process.
manifests() {
	local ca_bundle
	ca_bundle=$(base64 -w0 <"$PKI/ca.crt")
	cat <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:aggregated-metrics-reader
  labels:
    rbac.authorization.k8s.io/aggregate-to-view: "true"
    rbac.authorization.k8s.io/aggregate-to-edit: "true"
    rbac.authorization.k8s.io/aggregate-to-admin: "true"
rules:
- apiGroups: ["metrics.k8s.io"]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
# What the kubelets authorize (webhook, SubjectAccessReview): /metrics/resource
# is nodes/metrics, /stats is nodes/stats.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:metrics-server
rules:
- apiGroups: [""]
  resources: ["nodes/metrics", "nodes/stats"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:metrics-server
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:metrics-server
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:metrics-server
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: metrics-server:system:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:metrics-server
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: metrics-server-auth-reader
  namespace: kube-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: extension-apiserver-authentication-reader
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:metrics-server
---
apiVersion: v1
kind: Service
metadata:
  name: metrics-server
  namespace: kube-system
spec:
  ports:
  - name: https
    port: 443
    protocol: TCP
    targetPort: $METRICS_SERVER_PORT
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: metrics-server
  namespace: kube-system
  labels:
    kubernetes.io/service-name: metrics-server
    endpointslice.kubernetes.io/managed-by: sandman-local
addressType: IPv4
endpoints:
- addresses: ["$BRIDGE_IP"]
  conditions: {ready: true}
ports:
- name: https
  port: $METRICS_SERVER_PORT
  protocol: TCP
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.k8s.io
spec:
  service:
    name: metrics-server
    namespace: kube-system
    port: 443
  group: metrics.k8s.io
  version: v1beta1
  caBundle: $ca_bundle
  groupPriorityMinimum: 100
  versionPriority: 100
YAML
}

up() {
	need "$METRICS_SERVER_BIN/metrics-server" "hack/build-tools.sh metrics-server"
	need "$KUBE_BIN/kubectl" "hack/build-tools.sh"
	need curl "hack/install-deps.sh"
	local kubectl=("$KUBE_BIN/kubectl" --kubeconfig "$PKI/admin.kubeconfig")
	"${kubectl[@]}" get --raw /readyz >/dev/null 2>&1 || die "the apiserver does not answer: run hack/local-up.sh first"
	# The apiserver must have been started with apiserver_flags: without them
	# the aggregation layer cannot authenticate to metrics-server.
	local rh_ca
	rh_ca=$("${kubectl[@]}" -n kube-system get configmap extension-apiserver-authentication \
		-o jsonpath='{.data.requestheader-client-ca-file}' 2>/dev/null || true)
	[[ $rh_ca == *"BEGIN CERTIFICATE"* ]] ||
		die "kube-apiserver runs without --requestheader-client-ca-file: start it with the flags of '$0 apiserver-flags'"
	mkdir -p "$SANDMAN_STATE"/{pids,logs}
	pki

	# Before the process: its informers and its delegated authentication need
	# the RBAC, and it does not become live without them.
	manifests | "${kubectl[@]}" apply -f - >/dev/null
	log "metrics-server: RBAC, Service, EndpointSlice and APIService applied"

	start metrics-server "curl -fsS --cacert $PKI/ca.crt https://$BRIDGE_IP:$METRICS_SERVER_PORT/livez" \
		"$METRICS_SERVER_BIN/metrics-server" \
		--bind-address "$BRIDGE_IP" --secure-port "$METRICS_SERVER_PORT" \
		--tls-cert-file "$PKI/metrics-server.crt" --tls-private-key-file "$PKI/metrics-server.key" \
		--kubeconfig "$PKI/metrics-server.kubeconfig" \
		--authentication-kubeconfig "$PKI/metrics-server.kubeconfig" \
		--authorization-kubeconfig "$PKI/metrics-server.kubeconfig" \
		--client-ca-file "$PKI/ca.crt" \
		--requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
		--requestheader-allowed-names front-proxy-client \
		--requestheader-username-headers X-Remote-User \
		--requestheader-group-headers X-Remote-Group \
		--requestheader-extra-headers-prefix X-Remote-Extra- \
		--kubelet-client-certificate "$PKI/metrics-server-client.crt" \
		--kubelet-client-key "$PKI/metrics-server-client.key" \
		--kubelet-certificate-authority "$PKI/ca.crt" \
		--kubelet-preferred-address-types InternalIP \
		--kubelet-use-node-status-port \
		--metric-resolution 10s --kubelet-request-timeout 5s \
		--profiling=false --v 1

	local deadline=$((SECONDS + 60)) status=
	while :; do
		status=$("${kubectl[@]}" get apiservice v1beta1.metrics.k8s.io \
			-o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null || true)
		[ "$status" = True ] && break
		if [ $SECONDS -ge $deadline ]; then
			"${kubectl[@]}" get apiservice v1beta1.metrics.k8s.io \
				-o jsonpath='{.status.conditions[?(@.type=="Available")].message}{"\n"}' >&2 || true
			die "APIService v1beta1.metrics.k8s.io not Available after 60 s; log: $SANDMAN_STATE/logs/metrics-server.log"
		fi
		sleep 1
	done
	log "metrics-server: APIService v1beta1.metrics.k8s.io Available (kubectl top has data after two scrapes, ~20 s)"
}

down() {
	local f=$SANDMAN_STATE/pids/metrics-server.pid pid
	if [ -x "$KUBE_BIN/kubectl" ] && [ -f "$PKI/admin.kubeconfig" ]; then
		# An unavailable APIService breaks discovery (and namespace deletion).
		"$KUBE_BIN/kubectl" --kubeconfig "$PKI/admin.kubeconfig" --request-timeout 5s \
			delete apiservice v1beta1.metrics.k8s.io --ignore-not-found >/dev/null 2>&1 || true
	fi
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	rm -f "$f"
	kill -0 "$pid" 2>/dev/null || return 0
	log "metrics-server: stopping (pid $pid)"
	kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-up}" in
pki) mkdir -p "$PKI"; pki ;;
up) up ;;
down) down ;;
apiserver-flags) apiserver_flags ;;
*) die "usage: $0 [pki|up|down|apiserver-flags]" ;;
esac
