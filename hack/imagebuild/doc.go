// Command imagebuild makes the OCI images of sandman's components without a
// container engine and pushes them to a registry:
//
//	sandman/sandman-vk    /usr/local/bin/sandman-vk; user 65532
//	sandman/sandman-node  /usr/local/bin/sandman-node and the daemon it hands
//	                      to sandboxes, /usr/local/lib/sandman/sandman-daemon, and
//	                      the runc it runs them with (-runc), /usr/local/lib/sandman/runc,
//	                      and gVisor's runsc (-runsc), /usr/local/lib/sandman/runsc, and
//	                      stargz-snapshotter (-stargz), /usr/local/bin/containerd-stargz-grpc; user root
//	sandman/sandman-gateway /usr/local/bin/sandman-gateway, the E2B-compatible API; user 65532
//	sandman/sandmanctl    /usr/local/bin/sandmanctl; user 65532
//	sandman/pause         /pause, the pod sandbox image for the kubelet; user 65535
//	sandman/e2e-trainer   /usr/local/bin/e2e-trainer, the e2e trainer pod; user 65532
//
// Each image is a base layer made here (/etc/passwd and /etc/group with root
// and nonroot 65532, /tmp) and one layer of static binaries, built with
// CGO_ENABLED=0 -trimpath -buildvcs=false. Builds are reproducible: tar entries
// are sorted with mtime 0, owner 0:0 and fixed modes, gzip has a fixed header,
// the config's created time is the Unix epoch (or SOURCE_DATE_EPOCH) and there
// is no history, so the same source and Go toolchain give the same digests.
//
// Usage, from the repository root:
//
//	go run ./hack/imagebuild -registry 127.0.0.1:15000 -tag dev,$(git rev-parse --short HEAD) -print-digests
//
// -registry "" skips pushing; -layout DIR also writes an OCI image layout.
package main
