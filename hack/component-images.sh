#!/usr/bin/env bash
# Builds sandman's component images (sandman-vk, sandman-node, sandman-gateway, sandmanctl,
# pause, e2e-trainer) with hack/imagebuild, no container engine involved, and
# pushes them tagged `dev` and the git short SHA. Prints one
# <registry>/sandman/<image>@sha256:... line per image on stdout.
#   REGISTRY=host[:port]      push there (default: the local stack's registry,
#                             127.0.0.1:$REGISTRY_PORT; credentials from the
#                             Docker config)
#   IMAGES=sandman-vk,pause   only these images (default all)
#   TAGS=dev,extra            these tags instead of dev and the short SHA
# Extra arguments go to imagebuild (e.g. -layout DIR).
set -o errexit -o nounset -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REGISTRY=${REGISTRY:-127.0.0.1:$REGISTRY_PORT}
if [ "$REGISTRY" = "127.0.0.1:$REGISTRY_PORT" ]; then
	curl -fsS "http://$REGISTRY/v2/" >/dev/null || die "registry at $REGISTRY is not up: run hack/local-up.sh"
fi

tags=${TAGS:-dev}
if [ -z "${TAGS:-}" ] && sha=$(git -C "$SANDMAN_ROOT" rev-parse --short HEAD 2>/dev/null); then
	tags+=,$sha
fi
log "component images: building and pushing to $REGISTRY (tags $tags)"
cd "$SANDMAN_ROOT"
need "$RUNC_BIN" "hack/build-tools.sh runc (the sandman-node image carries it)"
need "$RUNSC_BIN" "hack/build-tools.sh gvisor (the sandman-node image carries it)"
# The binaries' --version: the commit (and -dirty for a changed tree); the
# images build without VCS info, so nothing else would say it.
version=${VERSION:-$(git -C "$SANDMAN_ROOT" describe --tags --always --dirty 2>/dev/null || echo dev)}
# stargz-snapshotter (deploy/components/lazy-pull) when it was built.
stargz=()
[ -x "$STARGZ_BIN" ] && stargz=(-stargz "$STARGZ_BIN")
go run ./hack/imagebuild -registry "$REGISTRY" -tag "$tags" -version "$version" -images "${IMAGES:-all}" -runc "$RUNC_BIN" -runsc "$RUNSC_BIN" "${stargz[@]}" -print-digests "$@"
