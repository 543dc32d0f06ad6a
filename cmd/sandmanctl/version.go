package main

import (
	"fmt"

	"github.com/sandman-dev/sandman/internal/buildinfo"
)

// version is what a release build stamps with -ldflags
// "-X main.version=v1.2.3"; empty, the build info says (buildinfo.Version).
var version string

// showVersion prints sandmanctl's version. It needs no cluster.
func (c *ctl) showVersion(args []string) error {
	if len(args) != 0 {
		return fail(exitUsage, "version: takes no arguments")
	}
	fmt.Fprintln(c.out, "sandmanctl", buildinfo.Version(version))
	return nil
}
