package main

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// selfUsage is this process's CPU time and resident memory: the virtual
// node's own share of its node figures.
func selfUsage() (cpuNanos, memoryBytes uint64) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		cpuNanos = uint64(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// statm: size resident shared ... in pages.
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				memoryBytes = pages * uint64(os.Getpagesize())
			}
		}
	}
	return cpuNanos, memoryBytes
}
