//go:build deps

// Package deps pins the given dependencies before the code that uses them
// lands, so that go.mod holds the versions the project is built against
// (virtual-kubelet v1.14.1 on k8s.io/* v0.37.2). `make verify-deps` runs
// virtual-kubelet's own tests against these pins.
package deps

import (
	_ "github.com/containerd/containerd/v2/client"
	_ "github.com/opencontainers/runtime-spec/specs-go"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	_ "k8s.io/client-go/kubernetes"
)
