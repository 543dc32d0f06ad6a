package noderuntime

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Orphaned shims. containerd starts a task's shim process and then
// records it; a containerd that dies in between finds, when it starts
// again, a bundle whose shim it cannot reach, and deletes the bundle. The
// shim lives on, idle, with nothing that will ever stop it (seen when
// containerd was killed during a burst of binds: TestOutageContainerdDuringBurst).
// reapShims kills the shims of this runtime's namespace that are orphaned
// so: their working directory (the bundle) is deleted and they have no
// child process (a shim serving a shim group's other containers has
// their processes as children, whatever became of the bundle it started
// in).

// shimReapEvery is how often Run looks for orphaned shims.
const shimReapEvery = 30 * time.Second

// runShimReaper reaps orphaned shims every shimReapEvery until ctx ends.
func (r *Runtime) runShimReaper(ctx context.Context) {
	t := r.cfg.Clock.NewTicker(shimReapEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			r.reapShims()
		}
	}
}

// reapShims kills this runtime's orphaned shims and says how many.
func (r *Runtime) reapShims() int {
	n := 0
	for _, s := range orphanShims(r.cfg.Namespace) {
		if err := syscall.Kill(s.pid, syscall.SIGKILL); err != nil {
			continue
		}
		n++
		r.log.Warn("killed an orphaned containerd shim (its bundle was deleted, it ran nothing: containerd lost it in a restart)",
			"pid", s.pid, "id", s.id)
	}
	return n
}

type shimProc struct {
	pid int
	id  string
}

// orphanShims lists the shim processes of containerd namespace ns whose
// bundle is deleted and that have no children.
func orphanShims(ns string) []shimProc {
	var out []shimProc
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("containerd-shim")) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") || flagValue(args, "namespace") != ns {
			continue
		}
		dir := filepath.Dir(p)
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join(dir, "cwd"))
		if err != nil || !strings.HasSuffix(cwd, " (deleted)") || hasChildren(dir) {
			continue
		}
		out = append(out, shimProc{pid: pid, id: flagValue(args, "id")})
	}
	return out
}

// flagValue is the value of -name or --name in args.
func flagValue(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-"+name || args[i] == "--"+name {
			return args[i+1]
		}
	}
	return ""
}

// hasChildren says whether the process at /proc/<pid> (dir) has children
// (any of its threads' children files lists one; a read that fails counts
// as having them, so nothing is killed on a guess).
func hasChildren(dir string) bool {
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil {
		return true
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "children"))
		if err != nil || len(bytes.TrimSpace(b)) > 0 {
			return true
		}
	}
	return false
}
