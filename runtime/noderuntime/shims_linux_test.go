package noderuntime

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// fakeShim starts a process whose command line is a shim's of namespace
// ns and id: a shell that waits on its stdin, forking a child first when
// child is set; its working directory is a bundle directory, deleted
// when gone is set.
func fakeShim(t *testing.T, ns, id string, child, gone bool) int {
	t.Helper()
	bundle := filepath.Join(t.TempDir(), id)
	if err := os.Mkdir(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "read x"
	if child {
		script = "sleep 300 & read x"
	}
	cmd := exec.Command("/bin/sh", "-c", script, "-namespace", ns, "-id", id)
	cmd.Args[0] = "containerd-shim-runc-v2"
	cmd.Dir = bundle
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if gone {
		if err := os.RemoveAll(bundle); err != nil {
			t.Fatal(err)
		}
	}
	return cmd.Process.Pid
}

// An orphaned shim is one of the namespace's, in a deleted bundle, with
// no children: a shim whose bundle is there, one that runs a process,
// and another namespace's are left alone.
func TestOrphanShims(t *testing.T) {
	ns := fmt.Sprintf("sandman-test-%d", os.Getpid())
	orphan := fakeShim(t, ns, "orphan", false, true)
	fakeShim(t, ns, "live", false, false)
	fakeShim(t, ns, "serving", true, true)
	fakeShim(t, ns+"-other", "elsewhere", false, true)
	var got []shimProc
	// The shell forks its child as it starts.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got = orphanShims(ns)
		if len(got) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !slices.Equal(got, []shimProc{{pid: orphan, id: "orphan"}}) {
		t.Fatalf("orphaned shims: %+v, want pid %d (orphan)", got, orphan)
	}
}
