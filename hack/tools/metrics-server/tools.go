//go:build tools

// Package metricsserver pins the metrics-server command built by
// hack/build-tools.sh.
package metricsserver

import (
	_ "sigs.k8s.io/metrics-server/cmd/metrics-server"
)
