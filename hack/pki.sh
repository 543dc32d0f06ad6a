#!/usr/bin/env bash
# Makes the local stack's certificates with openssl into $SANDMAN_STATE/pki:
# a cluster CA, the apiserver's serving certificate, client certificates for
# the admin, the scheduler, the controller-manager and the apiserver's kubelet
# client, the service-account key pair, and kubeconfigs for each client.
# Existing files are kept, so a second run changes nothing.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need openssl "hack/install-deps.sh"

PKI=$SANDMAN_STATE/pki
mkdir -p "$PKI"
cd "$PKI"

if [ ! -f ca.crt ]; then
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=sandman-local-ca" \
		-keyout ca.key -out ca.crt 2>/dev/null
fi

# cert NAME SUBJECT [SAN]: a key and a certificate signed by the CA.
cert() {
	local name=$1 subj=$2 san=${3:-}
	[ -f "$name.crt" ] && return
	openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$name.key" -out "$name.csr" 2>/dev/null
	local ext
	ext=$(mktemp)
	if [ -n "$san" ]; then
		printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$ext"
	else
		printf 'extendedKeyUsage=clientAuth\n' >"$ext"
	fi
	openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
		-extfile "$ext" -out "$name.crt" 2>/dev/null
	rm -f "$name.csr" "$ext"
}

cert apiserver "/CN=kube-apiserver" \
	"IP:127.0.0.1,IP:$SERVICE_IP,IP:$BRIDGE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=sandman-admin"
cert scheduler "/CN=system:kube-scheduler"
cert controller-manager "/CN=system:kube-controller-manager"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
# The virtual node's kubelet API (sandman-vk on the bridge address).
cert kubelet-serving "/CN=sandman-virtual-kubelet" "IP:$BRIDGE_IP,IP:127.0.0.1,DNS:localhost"

# The real worker: its kubelet's identity (Node authorizer, NodeRestriction),
# its serving certificate at the node's InternalIP (the apiserver verifies it
# against the CA), and kube-proxy's identity (bound to system:node-proxier).
cert kubelet "/O=system:nodes/CN=system:node:$WORKER_NAME"
cert kubelet-worker-serving "/O=system:nodes/CN=system:node:$WORKER_NAME" "IP:$BRIDGE_IP,DNS:$WORKER_NAME"
cert kube-proxy "/CN=system:kube-proxy"

if [ ! -f sa.key ]; then
	openssl genrsa -out sa.key 2048 2>/dev/null
	openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi

kubeconfig admin
kubeconfig scheduler
kubeconfig controller-manager
kubeconfig kubelet
kubeconfig kube-proxy
chmod 600 ./*.key
