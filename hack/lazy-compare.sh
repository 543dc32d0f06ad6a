#!/usr/bin/env bash
# The measurement behind the choice of a lazy-pulling snapshotter:
# stargz-snapshotter (eStargz) against soci-snapshotter (SOCI index v2) and
# against today's full pull into overlayfs, on one image of LAZY_MIB (1024)
# MiB of incompressible files, from a local registry behind a proxy that
# counts bytes and, for the "throttled" rows, paces them to LAZY_MIBPS (100)
# MiB/s. Everything runs beside (not in) the local stack: an isolated
# containerd with both snapshotters as proxy plugins, its own registry, under
# $SANDMAN_STATE/lazy-compare; each run starts from empty daemons and caches.
# Prints two markdown tables (docs/benchmarks.md). Needs the stack's tools
# (hack/build-tools.sh) and Debian's zlib1g-dev (soci links zlib). Not in
# make test or make bench: soci is built only here.
#   N=3 LAZY_MIB=1024 LAZY_MIBPS=100 bash hack/lazy-compare.sh
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ "$(id -u)" = 0 ] || die "run as root: containerd and FUSE need it"
N=${N:-3} LAZY_MIB=${LAZY_MIB:-1024} LAZY_MIBPS=${LAZY_MIBPS:-100}
SOCI_VERSION=v0.16.1
# The soci cmd module has no tags in the module proxy; this is its commit at v0.16.1.
SOCI_CMD_VERSION=v0.0.0-20260930233240-61147fe7c929
need "$CONTAINERD_BIN/containerd" "hack/build-tools.sh"
need "$REGISTRY_BIN/registry" "hack/build-tools.sh"
[ -e /usr/lib/x86_64-linux-gnu/libz.a ] || die "soci links zlib statically: apt-get install zlib1g-dev"

BIN=$SANDMAN_CACHE/lazy-compare
S=$SANDMAN_STATE/lazy-compare
REG=127.0.0.1:15900 THROTTLED=127.0.0.1:15901 DIRECT=127.0.0.1:15902
mkdir -p "$BIN"

log "building containerd-stargz-grpc, lazycompare (hack/tools/stargz) and sandmanctl"
(cd "$SANDMAN_ROOT/hack/tools/stargz" && go build -o "$BIN/containerd-stargz-grpc" . && go build -o "$BIN/lazycompare" ./lazycompare)
(cd "$SANDMAN_ROOT" && go build -o "$BIN/sandmanctl" ./cmd/sandmanctl)
if [ ! -x "$BIN/soci-snapshotter-grpc" ]; then
	log "building soci-snapshotter $SOCI_VERSION from the module proxy's zips (cgo, zlib)"
	src=$(mktemp -d)
	root=$(go mod download -json "github.com/awslabs/soci-snapshotter@$SOCI_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
	cmd=$(go mod download -json "github.com/awslabs/soci-snapshotter/cmd@$SOCI_CMD_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
	cp -r "$root/." "$src/" && mkdir -p "$src/cmd" && cp -r "$cmd/." "$src/cmd/" && chmod -R u+w "$src"
	(cd "$src/cmd" && CGO_ENABLED=1 go build -o "$BIN/" ./soci-snapshotter-grpc ./soci)
	rm -rf "$src"
fi
export PATH=$BIN:$CONTAINERD_BIN:$(dirname "$RUNC_BIN"):$PATH

pids=()
stop_daemons() {
	pkill -f "containerd --config $S/" || true
	pkill -f "containerd-stargz-grpc --address $S/" || true
	pkill -f "soci-snapshotter-grpc --address $S/" || true
	for _ in $(seq 100); do pgrep -f "(containerd|containerd-stargz-grpc|soci-snapshotter-grpc) (--config|--address) $S/" >/dev/null || break; sleep 0.1; done
	pkill -9 -f "containerd-shim-runc-v2 -namespace lazycompare" || true
	grep " $S/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
}
cleanup() {
	stop_daemons
	[ ${#pids[@]} = 0 ] || kill "${pids[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$S"
}
trap cleanup EXIT
cleanup; mkdir -p "$S"

cat >"$S/containerd.toml" <<TOML
version = 3
root = "$S/containerd/root"
state = "$S/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime"]
[grpc]
  address = "$S/containerd.sock"
[ttrpc]
  address = "$S/containerd.sock.ttrpc"
[proxy_plugins.stargz]
  type = "snapshot"
  address = "$S/stargz.sock"
[proxy_plugins.soci]
  type = "snapshot"
  address = "$S/soci.sock"
# Each run pulls every byte again, whatever an earlier one fetched.
[plugins."io.containerd.metadata.v1.bolt"]
  content_sharing_policy = "isolated"
TOML
printf '[blob]\nchunk_size = 1048576\n' >"$S/stargz.toml"
printf '[content_store]\ntype = "containerd"\ncontainerd_address = "%s"\n' "$S/containerd.sock" >"$S/soci.toml"
cat >"$S/registry.yml" <<YML
version: 0.1
storage:
  filesystem:
    rootdirectory: $S/registry
http:
  addr: $REG
log:
  level: error
YML
"$REGISTRY_BIN/registry" serve "$S/registry.yml" >"$S/registry.log" 2>&1 & pids+=($!)
lazycompare proxy "$THROTTLED" "http://$REG" "$LAZY_MIBPS" >"$S/proxy1.log" 2>&1 & pids+=($!)
lazycompare proxy "$DIRECT" "http://$REG" 0 >"$S/proxy2.log" 2>&1 & pids+=($!)

# Fresh daemons, empty state, counters at zero.
reset() {
	stop_daemons
	rm -rf "$S/containerd" "$S/stargz" "$S/soci"
	containerd-stargz-grpc --address "$S/stargz.sock" --root "$S/stargz" --config "$S/stargz.toml" >>"$S/stargz.log" 2>&1 &
	soci-snapshotter-grpc --address "$S/soci.sock" --root "$S/soci" --config "$S/soci.toml" >>"$S/soci.log" 2>&1 &
	for _ in $(seq 100); do [ -S "$S/stargz.sock" ] && [ -S "$S/soci.sock" ] && break; sleep 0.1; done
	containerd --config "$S/containerd.toml" >>"$S/containerd.log" 2>&1 &
	for _ in $(seq 100); do ctr --address "$S/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.1; done
	curl -fsS "$THROTTLED/_served?reset=1" >/dev/null
	curl -fsS "$DIRECT/_served?reset=1" >/dev/null
}
served() { curl -fsS "$1/_served"; }
# run REGISTRY SNAPSHOTTER TAG CMD...: the first command's total ms.
run() {
	local reg=$1 snap=$2 tag=$3; shift 3
	lazycompare run "$S/containerd.sock" "$snap" "$reg/lazy/big:$tag" "$@" | sed -n 's/.*total_ms=\([0-9]*\).*/\1/p'
}

for _ in $(seq 50); do curl -fsS "http://$REG/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
reset
log "image: $LAZY_MIB MiB of random files"
lazycompare mkimage "$REG/lazy/big:plain" "$LAZY_MIB" $((LAZY_MIB / 8))
t=$(date +%s%N)
(sandmanctl images convert --prioritize app/main.sh,app/hello.txt \
	--to "$REG/lazy/big:estargz" "$REG/lazy/big:plain") >>"$S/convert.log" 2>&1 || { cat "$S/convert.log"; die "eStargz conversion failed"; }
log "eStargz conversion and push: $((($(date +%s%N) - t) / 1000000)) ms"
t=$(date +%s%N)
lazycompare fetch "$S/containerd.sock" "$REG/lazy/big:plain"
soci --address "$S/containerd.sock" -n lazycompare --root "$S/soci" convert "$REG/lazy/big:plain" "$REG/lazy/big:soci" >>"$S/convert.log"
lazycompare push "$S/containerd.sock" "$REG/lazy/big:soci"
log "SOCI fetch, convert and push: $((($(date +%s%N) - t) / 1000000)) ms"

modes="overlayfs:plain stargz:estargz soci:soci"
echo "| registry | snapshotter | n | pull → first command answered, ms (each run) | bytes from the registry by then |"
echo "|---|---|---|---|---|"
for reg in "$THROTTLED" "$DIRECT"; do
	what="unthrottled"; [ "$reg" = "$THROTTLED" ] && what="$LAZY_MIBPS MiB/s"
	for m in $modes; do
		times=() bytes=()
		for _ in $(seq "$N"); do
			reset
			times+=("$(run "$reg" "${m%%:*}" "${m#*:}" /bin/busybox cat /app/hello.txt)")
			bytes+=("$(served "$reg")")
		done
		echo "| $what | ${m%%:*} | $N | ${times[*]} | ${bytes[*]} |"
	done
done
echo
echo "| snapshotter | first command, ms | then read all $LAZY_MIB MiB, ms | read all again, ms | a second container: first command, ms | bytes the second fetched |"
echo "|---|---|---|---|---|---|"
for m in $modes; do
	reset
	a=$(run "$DIRECT" "${m%%:*}" "${m#*:}" /bin/busybox cat /app/hello.txt)
	b=$(run "$DIRECT" "${m%%:*}" "${m#*:}" /bin/busybox sh -c 'cat /data/* >/dev/null')
	c=$(run "$DIRECT" "${m%%:*}" "${m#*:}" /bin/busybox sh -c 'cat /data/* >/dev/null')
	before=$(served "$DIRECT")
	d=$(run "$DIRECT" "${m%%:*}" "${m#*:}" /bin/busybox cat /app/hello.txt)
	echo "| ${m%%:*} | $a | $b | $c | $d | $(($(served "$DIRECT") - before)) |"
done
