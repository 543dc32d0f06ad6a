package main

import (
	"runtime/debug"
	"strings"
)

// kubeletVersion is the kubelet version the virtual node reports: the
// Kubernetes release of the client-go it is built with (client-go
// v0.X.Y is Kubernetes v1.X.Y), marked -sandman.
func kubeletVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return kubeletVersionOf(bi)
}

// kubeletVersionOf is kubeletVersion for the build info bi (nil: none).
func kubeletVersionOf(bi *debug.BuildInfo) string {
	const fallback = "v0.0.0-sandman"
	if bi == nil {
		return fallback
	}
	for _, m := range bi.Deps {
		if m.Path != "k8s.io/client-go" {
			continue
		}
		if m.Replace != nil {
			m = m.Replace
		}
		v, ok := strings.CutPrefix(m.Version, "v0.")
		if !ok {
			return fallback
		}
		// Drop a pre-release or build suffix: v0.37.2-rc.1 → v1.37.2.
		if i := strings.IndexAny(v, "-+"); i >= 0 {
			v = v[:i]
		}
		return "v1." + v + "-sandman"
	}
	return fallback
}
