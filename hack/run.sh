#!/usr/bin/env bash
# `make run`: the local stack, two sandman-node agents (two workers' worth of
# slots on this machine, in their own containerd namespaces), the virtual
# node (sandman-vk), the E2B gateway (sandman-gateway) with an API key and
# E2B's `base` template, and a demo: a sandbox pod created with the pool's
# node selector, a command run in it through its daemon, a sandbox created
# through the E2B API, and what to type next. Running it again reuses what
# runs and makes a fresh demo pod.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root"
bash "$SANDMAN_ROOT/hack/local-up.sh"
# shellcheck disable=SC1091
source "$SANDMAN_STATE/stack.env"
export KUBECONFIG
kubectl() { "$KUBECTL" "$@"; }

BIN=$SANDMAN_STATE/bin
mkdir -p "$BIN"
log "building sandman-node, sandman-vk, sandman-daemon, sandman-gateway and sandmanctl into $BIN"
for c in sandman-node sandman-vk sandman-daemon sandman-gateway sandmanctl; do
	(cd "$SANDMAN_ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/$c.new" "./cmd/$c")
	# Replace running binaries by rename, so a running agent is not disturbed.
	mv -f "$BIN/$c.new" "$BIN/$c"
done
TOKEN_FILE=$SANDMAN_STATE/pool-token
[ -f "$TOKEN_FILE" ] || { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOKEN_FILE"; chmod 600 "$TOKEN_FILE"; }
# The control keys, which derive the per-sandbox tokens kubectl exec and logs
# use, are sandman-vk's alone (the agents hold the pool token, not these):
# one a line, the current first. A first file keeps the pool token (the
# control key until then) as the previous key, so sandboxes of an earlier
# run are re-keyed rather than cut off. Rotate by writing a new first line.
CONTROL_KEYS=$SANDMAN_STATE/control-keys
[ -f "$CONTROL_KEYS" ] || (
	umask 077
	{ head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo; cat "$TOKEN_FILE"; echo; } >"$CONTROL_KEYS"
)

POOL=local
# Snapshots (sandmanctl snapshot, E2B's createSnapshot and templates built
# from code) go to the stack's registry, each namespace's under
# $SNAPSHOTS/e2b/<namespace>/.
SNAPSHOTS=$REGISTRY/sandman-snapshots
AGENTS=""
port=9661
for w in worker-a worker-b; do
	start "sandman-node-$w" "curl -fsS http://127.0.0.1:$port/healthz" \
		"$BIN/sandman-node" --node "$w" --containerd-address "$CONTAINERD_ADDRESS" --namespace "sandman-$w" \
		--slots 8 --warm-slots 2 --cpu 4 --memory 8Gi --state-dir "$SANDMAN_STATE/nodes/$w" \
		--daemon-path "$BIN/sandman-daemon" --runc "$RUNC_BIN" --runsc "$RUNSC_BIN" --cni-conf-dir "$CNI_CONF_DIR" --cni-bin-dir "$CNI_BIN_DIR" \
		--listen "127.0.0.1:$port" --token-file "$TOKEN_FILE" \
		--snapshot-registry "$SNAPSHOTS" --snapshot-repository "$SNAPSHOTS/e2b" --checkpoint-repository "$REGISTRY/sandman-checkpoints"
	AGENTS="$AGENTS${AGENTS:+,}$w=127.0.0.1:$port"
	port=$((port + 1))
done
start sandman-vk "curl -fsS http://127.0.0.1:9652/healthz" \
	"$BIN/sandman-vk" --kubeconfig "$KUBECONFIG" --pool "$POOL" --node-name "sandman-$POOL" \
	--node-ip "$BRIDGE_IP" --kubelet-listen "$BRIDGE_IP:10250" \
	--tls-cert-file "$PKI/kubelet-serving.crt" --tls-key-file "$PKI/kubelet-serving.key" --client-ca-file "$PKI/ca.crt" \
	--node-agents "$AGENTS" --token-file "$TOKEN_FILE" --pool-secret-file "$CONTROL_KEYS" --metrics-listen 127.0.0.1:9652 \
	--privilege-escalation-namespaces default

log "waiting for node sandman-$POOL to be Ready"
deadline=$((SECONDS + 60))
until kubectl wait --for=condition=Ready "node/sandman-$POOL" --timeout=5s >/dev/null 2>&1; do
	[ $SECONDS -lt $deadline ] || die "virtual node not Ready; log: $SANDMAN_STATE/logs/sandman-vk.log"
done
kubectl get nodes -o wide

# The demo sandbox: the pool's node selector and toleration, a token hash.
TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
HASH=$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)
kubectl delete pod sandbox-demo --ignore-not-found --wait=true >/dev/null
kubectl apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: sandbox-demo
  labels: {sandman.io/job: demo}
  annotations: {sandman.io/token-sha256: "$HASH"}
spec:
  nodeSelector: {sandman.io/pool: $POOL}
  tolerations: [{key: sandman.io/pool, operator: Exists, effect: NoSchedule}]
  containers:
  - name: task
    image: $DEBIAN_IMAGE
    resources: {requests: {cpu: 250m, memory: 256Mi}, limits: {memory: 1Gi}}
YAML
kubectl wait --for=condition=Ready pod/sandbox-demo --timeout=120s
IP=$(kubectl get pod sandbox-demo -o jsonpath='{.status.podIP}')
kubectl get pod sandbox-demo -o wide
"$BIN/sandmanctl" --kubeconfig "$KUBECONFIG" top nodes --pool "$POOL"
log "running a command in the sandbox through its daemon at $IP:49983"
curl -fsS -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
	-d '{"shell":"echo hello from $(hostname); uname -sr; python3 --version"}' "http://$IP:49983/v1/exec"
echo

# The E2B gateway: sandboxes in namespace default on this pool (which lets
# them sudo: sandman-vk --privilege-escalation-namespaces above); an API key
# kept in $SANDMAN_STATE (only its hash goes to the cluster); the template
# `base`, which is E2B's base template (user `user`, sudo, curl, git); the
# files of templates' COPY steps in the stack's registry under the agents'
# --snapshot-repository, as a deployed gateway's (docs/e2b.md).
E2B_NS=default
E2B_KEY_FILE=$SANDMAN_STATE/e2b-api-key
[ -f "$E2B_KEY_FILE" ] || (umask 077 && printf 'e2b_%s\n' "$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$E2B_KEY_FILE")
E2B_API_KEY=$(cat "$E2B_KEY_FILE")
GATEWAY_TOKEN_KEY=$SANDMAN_STATE/gateway-token-key
[ -f "$GATEWAY_TOKEN_KEY" ] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$GATEWAY_TOKEN_KEY")
kubectl -n "$E2B_NS" create secret generic sandman-gateway-keys --dry-run=client -o yaml \
	--from-literal=local="{\"sha256\":\"$(printf %s "$E2B_API_KEY" | sha256sum | cut -d' ' -f1)\",\"namespace\":\"$E2B_NS\",\"pool\":\"$POOL\"}" |
	kubectl apply -f - >/dev/null
kubectl -n "$E2B_NS" create configmap sandman-gateway-templates --dry-run=client -o yaml \
	--from-literal=base="{\"image\":\"$E2B_BASE_IMAGE\",\"cpu\":\"500m\",\"memory\":\"512Mi\",\"allowPrivilegeEscalation\":true,\"user\":\"user\"}" \
	--from-literal=debian="{\"image\":\"$DEBIAN_IMAGE\",\"cpu\":\"500m\",\"memory\":\"512Mi\"}" |
	kubectl apply -f - >/dev/null
E2B_URL=http://127.0.0.1:3000
start sandman-gateway "curl -fsS http://127.0.0.1:9653/healthz" \
	"$BIN/sandman-gateway" --kubeconfig "$KUBECONFIG" --listen 127.0.0.1:3000 --metrics-listen 127.0.0.1:9653 \
	--namespace "$E2B_NS" --keys-secret "$E2B_NS/sandman-gateway-keys" --templates-configmap "$E2B_NS/sandman-gateway-templates" \
	--token-key-file "$GATEWAY_TOKEN_KEY" \
	--template-upload-repository "$SNAPSHOTS/e2b" --template-upload-insecure
log "creating a sandbox from the template base through the E2B API at $E2B_URL"
E2B_SBX=$(curl -fsS -H "X-API-Key: $E2B_API_KEY" -H 'Content-Type: application/json' \
	-d '{"templateID":"base","timeout":60,"metadata":{"from":"make-run"}}' "$E2B_URL/sandboxes" | jq -r .sandboxID)
kubectl get pod "$E2B_SBX" -o wide
curl -fsS -o /dev/null -H "X-API-Key: $E2B_API_KEY" -X DELETE "$E2B_URL/sandboxes/$E2B_SBX"

cat >&2 <<MSG

The virtual node sandman-$POOL runs over two node agents (worker-a, worker-b).
Try:
  export KUBECONFIG=$KUBECONFIG
  $KUBECTL get nodes; $KUBECTL get pods -o wide
  curl -H 'Authorization: Bearer $TOKEN' -d '{"cmd":["ls","/"]}' http://$IP:49983/v1/exec
  $KUBECTL delete pod sandbox-demo        # frees its slot
  $BIN/sandmanctl top nodes                # capacity per worker (--watch)
  open http://127.0.0.1:9652/capacity      # the live capacity page
  curl -s http://127.0.0.1:9652/metrics    # Prometheus metrics (deploy/base/grafana: the dashboard)
E2B's SDK (npm i e2b / pip install e2b) runs unchanged against the gateway (docs/e2b.md):
  export E2B_API_URL=$E2B_URL E2B_SANDBOX_URL=$E2B_URL E2B_API_KEY=$E2B_API_KEY
  node -e "const {Sandbox}=require('e2b'); Sandbox.create('base').then(async s=>{console.log((await s.commands.run('whoami; sudo id -u')).stdout); await s.kill()})"
Logs: $SANDMAN_STATE/logs/{sandman-vk,sandman-gateway,sandman-node-worker-a,sandman-node-worker-b}.log
The deployed path, beside it on the same stack (pool "deployed", docs/install.md):
  $KUBECTL apply -k deploy/overlays/local
Stop everything: make local-down
MSG
