package framework

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestStackUp runs hack/lib.sh's stack_up through StackUp against state
// directories made here: up only with stack.env and a running
// kube-apiserver and containerd recorded.
func TestStackUp(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	running := strconv.Itoa(os.Getpid())
	// A pid that ran and was reaped: no process has it now.
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	gone := strconv.Itoa(exited.Process.Pid)

	for _, tc := range []struct {
		name     string
		stackEnv bool
		pids     map[string]string
		up       bool
	}{
		{"nothing", false, nil, false},
		{"stack.env only", true, nil, false},
		{"up", true, map[string]string{"kube-apiserver": running, "containerd": running}, true},
		{"no stack.env", false, map[string]string{"kube-apiserver": running, "containerd": running}, false},
		{"apiserver exited", true, map[string]string{"kube-apiserver": gone, "containerd": running}, false},
		{"containerd exited", true, map[string]string{"kube-apiserver": running, "containerd": gone}, false},
		{"containerd not recorded", true, map[string]string{"kube-apiserver": running}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			t.Setenv("SANDMAN_STATE", state)
			if tc.stackEnv {
				if err := os.WriteFile(filepath.Join(state, "stack.env"), []byte("SANDMAN_STATE="+state+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(filepath.Join(state, "pids"), 0o755); err != nil {
				t.Fatal(err)
			}
			for name, pid := range tc.pids {
				if err := os.WriteFile(filepath.Join(state, "pids", name+".pid"), []byte(pid+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := StackUp(root)
			if up := err == nil; up != tc.up {
				t.Fatalf("StackUp = %v, want up %v", err, tc.up)
			}
		})
	}
}
