#!/usr/bin/env bash
# Installs the Debian packages the local stack and the tests need. Idempotent:
# packages already installed are not touched, and apt is not called at all
# when nothing is missing.
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PACKAGES=(
	runc                          # OCI runtime under containerd's shim (the kubelet's pods)
	libseccomp-dev                # builds the sandboxes' pinned runc with seccomp (hack/build-tools.sh)
	containernetworking-plugins   # bridge, host-local, loopback, portmap for slot networks
	iptables iproute2             # CNI bridge masquerade, netns and veth
	conntrack ethtool socat       # what the kubelet and kube-proxy expect on a worker
	busybox-static                # the tiny task image
	debootstrap                   # the Debian task image
	openssl                       # certificates for the control plane
	curl jq tmux procps psmisc util-linux kmod
	prometheus                    # scrapes the stack in the dashboard e2e test
	chromium                      # renders the capacity page in its e2e test
	ca-certificates
)

[ "$(id -u)" = 0 ] || die "run as root: apt-get needs it"
missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then log "debian packages: all installed"; exit 0; fi
log "debian packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
log "debian packages: done"
