//go:build linux

// Command pause is the only program of the sandman/pause pod sandbox image.
// As PID 1 of a pod sandbox it holds the pod's namespaces open: it waits for
// SIGTERM or SIGINT and exits 0, and reaps every child that is re-parented
// to it (SIGCHLD, then wait4 until none is left).
package main

import (
	"fmt"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1, so orphans are not re-parented to me")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGCHLD)
	for sig := range sigs {
		if sig == unix.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
		os.Exit(0)
	}
}

// reap collects every exited child without blocking. Signals coalesce, so
// one SIGCHLD may stand for several children.
func reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
