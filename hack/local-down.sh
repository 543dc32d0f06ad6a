#!/usr/bin/env bash
# Stops the local stack and removes what hack/local-up.sh and the node agents
# made: containers and their tasks, processes, mounts, network namespaces
# (named sandman-*), cgroups, the bridge and the state dir. Works on a
# half-started stack: it removes what exists and says what it could not.
# Caches ($SANDMAN_CACHE: binaries, images, registry data) are kept.
set -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root"
failed=0
warn() { log "warning: $*"; failed=1; }

# stop NAME...: TERM the recorded process groups, KILL what is left after 10 s.
stop() {
	local pids=() name f pid
	for name in "$@"; do
		f=$SANDMAN_STATE/pids/$name.pid
		[ -f "$f" ] || continue
		pid=$(cat "$f")
		rm -f "$f"
		kill -0 "$pid" 2>/dev/null || continue
		log "$name: stopping (pid $pid)"
		kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
		pids+=("$pid")
	done
	for _ in $(seq 100); do
		local left=0
		for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
		[ $left = 0 ] && return 0
		sleep 0.1
	done
	for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; done
	return 0
}

# Node agents and other sandman processes that tests or `make run` started.
agents=()
for f in "$SANDMAN_STATE"/pids/sandman-*.pid; do
	[ -e "$f" ] && agents+=("$(basename "$f" .pid)")
done
[ ${#agents[@]} -eq 0 ] || stop "${agents[@]}"

# The worker: the kubelet and kube-proxy stop first, so nothing restarts the
# pods whose containers go next. The network namespaces of its pods (made by
# containerd's CRI plugin) are read from their sandbox containers' specs now,
# while containerd can still say which are ours.
stop kube-proxy kubelet metrics-server
cri_netns=()
if [ -S "$CONTAINERD_ADDRESS" ] && [ -x "$CONTAINERD_BIN/ctr" ]; then
	for c in $("$CONTAINERD_BIN/ctr" --address "$CONTAINERD_ADDRESS" --timeout 10s -n k8s.io containers ls -q 2>/dev/null); do
		p=$("$CONTAINERD_BIN/ctr" --address "$CONTAINERD_ADDRESS" --timeout 10s -n k8s.io containers info "$c" 2>/dev/null |
			jq -r '.Spec.linux.namespaces[]? | select(.type == "network") | .path // empty' 2>/dev/null)
		[ -n "$p" ] && cri_netns+=("$p")
	done
fi

# Containers: kill every task runc knows under our state dir, then let
# containerd forget them, then stop containerd and its shims.
# The runc shim keeps runc state in /run/containerd/runc/<namespace>; sandman's
# containerd namespaces all start with "sandman".
for root in /run/containerd/runc/sandman* /run/containerd/runc/k8s.io; do
	[ -d "$root" ] || continue
	for id in $(runc --root "$root" list -q 2>/dev/null); do
		runc --root "$root" kill "$id" KILL 2>/dev/null
		runc --root "$root" delete -f "$id" 2>/dev/null || warn "runc delete $id failed"
	done
done
if [ -S "$CONTAINERD_ADDRESS" ] && [ -x "$CONTAINERD_BIN/ctr" ]; then
	ctr=("$CONTAINERD_BIN/ctr" --address "$CONTAINERD_ADDRESS" --timeout 10s)
	for ns in $("${ctr[@]}" namespaces ls -q 2>/dev/null); do
		for t in $("${ctr[@]}" -n "$ns" tasks ls -q 2>/dev/null); do
			"${ctr[@]}" -n "$ns" tasks kill -s KILL "$t" >/dev/null 2>&1
			"${ctr[@]}" -n "$ns" tasks delete -f "$t" >/dev/null 2>&1
		done
		for c in $("${ctr[@]}" -n "$ns" containers ls -q 2>/dev/null); do
			"${ctr[@]}" -n "$ns" containers delete "$c" >/dev/null 2>&1 || warn "container $ns/$c not deleted"
		done
	done
fi
stop containerd
# Shims outlive containerd by design; ours carry our socket in their args.
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_ADDRESS" 2>/dev/null); do
	kill -KILL "$pid" 2>/dev/null
done

# The lazy snapshotter unmounts its layers when it stops; what a killed one
# left mounted goes too.
stop stargz
grep " $SANDMAN_STATE/stargz/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null

stop registry kube-controller-manager kube-scheduler
stop kube-apiserver
stop etcd

rmdir /run/containerd/runc/sandman* 2>/dev/null

# Network namespaces made for slots and tests.
for ns in $(ip netns list 2>/dev/null | awk '/^sandman-/{print $1}'); do
	ip netns delete "$ns" 2>/dev/null || warn "netns $ns not deleted"
done
for p in "${cri_netns[@]}"; do
	[ -e "$p" ] || continue
	umount "$p" 2>/dev/null || umount -l "$p" 2>/dev/null
	rm -f "$p" || warn "netns $p not removed"
done
# The worker's pod network: its bridge, the addresses host-local handed out
# (to kubelet pods and to deployed slots alike), the masquerade rules of its
# pods, kube-proxy's chains, the node agent's guard rules, the conf containerd
# wrote from its template.
if ip link show "$WORKER_BRIDGE" >/dev/null 2>&1; then
	ip link delete "$WORKER_BRIDGE" || warn "bridge $WORKER_BRIDGE not deleted"
fi
rm -rf "/var/lib/cni/networks/$WORKER_CNI_NETWORK" "$WORKER_CNI_CONF_DIR/10-containerd-net.conflist"
if command -v iptables >/dev/null; then
	# iptables -S prints the comment's quotes escaped: name: \"sandman-worker\"
	iptables -t nat -S POSTROUTING 2>/dev/null | grep -F "name: \\\"$WORKER_CNI_NETWORK\\\"" | while read -r rule; do
		chain=$(sed -n 's/.* -j \(CNI-[0-9a-f]*\).*/\1/p' <<<"$rule")
		eval "iptables -t nat ${rule/-A /-D }" 2>/dev/null
		[ -n "$chain" ] && { iptables -t nat -F "$chain"; iptables -t nat -X "$chain"; } 2>/dev/null
	done
	iptables -S INPUT 2>/dev/null | grep -F 'sandman-node: sandboxes may not reach' | while read -r rule; do
		eval "iptables ${rule/-A /-D }" 2>/dev/null
	done
	[ -x "$KUBE_BIN/kube-proxy" ] && "$KUBE_BIN/kube-proxy" --cleanup >/dev/null 2>&1
	# The kubelet's own chains.
	for t in filter nat mangle; do
		for c in INPUT OUTPUT; do iptables -t $t -D $c -j KUBE-FIREWALL 2>/dev/null; done
		for c in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do iptables -t $t -F $c 2>/dev/null && iptables -t $t -X $c 2>/dev/null; done
	done
fi
if [ -d "$NODE_AGENT_STATE" ]; then
	for m in $(awk -v s="$NODE_AGENT_STATE" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || warn "umount $m failed"
	done
	rm -rf "$NODE_AGENT_STATE" || warn "could not remove $NODE_AGENT_STATE"
fi
# The kubelet's pod cgroups.
for d in $(find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name kubepods 2>/dev/null); do
	find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || warn "cgroup $d not removed"
done

if ip link show "$BRIDGE" >/dev/null 2>&1; then
	log "bridge $BRIDGE: deleting"
	ip link delete "$BRIDGE" || warn "bridge $BRIDGE not deleted"
fi

# Mounts under the state dir (snapshots, shm, netns bind mounts), deepest first.
if [ -d "$SANDMAN_STATE" ]; then
	for m in $(awk -v s="$SANDMAN_STATE" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || warn "umount $m failed"
	done
fi

# cgroups (v1 controllers and the unified tree) left by sandman's namespaces.
for d in $(find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name 'sandman*' 2>/dev/null); do
	find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || warn "cgroup $d not removed"
done

if [ -d "$SANDMAN_STATE" ]; then
	rm -rf "$SANDMAN_STATE" || warn "could not remove $SANDMAN_STATE"
fi
if [ $failed = 0 ]; then log "local stack: down"; else log "local stack: down, with warnings above"; fi
exit $failed
