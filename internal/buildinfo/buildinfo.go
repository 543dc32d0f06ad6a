// Package buildinfo says which build of sandman a binary is, for its
// --version and wherever it reports itself (the daemon's health): the
// version a release build stamps, else what the Go toolchain recorded in
// the binary (the main module's version; the VCS revision, its time and
// whether the tree was modified, when the build was made in a checkout).
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Version is the running binary's version. stamped, when not empty, is
// the version a release build sets in its main package with
// -ldflags "-X main.version=v1.2.3"; else it is the main module's version
// from the build info, "(devel)" when there is none. The VCS revision
// (12 digits), "modified" and the commit time follow in parentheses when
// the build recorded them and the version does not already carry the
// revision (a pseudo-version does):
//
//	v1.2.3
//	(devel) (0123456789ab, modified, 2026-07-01T10:00:00Z)
func Version(stamped string) string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(bi, stamped)
}

// versionOf is Version for the build info bi (nil: none).
func versionOf(bi *debug.BuildInfo, stamped string) string {
	v := stamped
	if v == "" && bi != nil {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	if bi == nil {
		return v
	}
	var rev, at string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return v
	}
	rev = rev[:min(len(rev), 12)]
	if strings.Contains(v, rev) {
		return v
	}
	parts := []string{rev}
	if modified {
		parts = append(parts, "modified")
	}
	if at != "" {
		parts = append(parts, at)
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}
