package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	kfake "k8s.io/client-go/kubernetes/fake"
)

// testCtl is a ctl over kube with its output kept.
func testCtl(t *testing.T, kube kubernetes.Interface) (*ctl, *strings.Builder, *strings.Builder) {
	var out, errw strings.Builder
	return &ctl{kube: kube, namespace: "ns", tokenDir: t.TempDir(), out: &out, errw: &errw}, &out, &errw
}

// exitCode is the exit code run gives err.
func exitCode(err error) int {
	var ce cliError
	if errors.As(err, &ce) {
		return ce.code
	}
	if err != nil {
		return exitError
	}
	return 0
}

func TestRunAndSnapshotUsage(t *testing.T) {
	c, _, _ := testCtl(t, kfake.NewClientset())
	for _, args := range [][]string{{"run"}, {"run", "--count", "0", "img"}, {"snapshot"}, {"snapshot", "pod"}, {"snapshot", "pod", "img", "extra"}} {
		if err := c.dispatch(t.Context(), args[0], args[1:]); exitCode(err) != exitUsage {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestVersionNeedsNoCluster: `sandmanctl version` answers without a
// kubeconfig, and takes no arguments.
func TestVersionNeedsNoCluster(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	var out, errw strings.Builder
	if code := run(t.Context(), []string{"--kubeconfig", filepath.Join(t.TempDir(), "none"), "version"}, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	if !strings.HasPrefix(out.String(), "sandmanctl ") || !strings.HasSuffix(out.String(), "\n") || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("printed %q", out.String())
	}
	out.Reset()
	if code := run(t.Context(), []string{"version", "extra"}, &out, &errw); code != exitUsage || out.Len() != 0 {
		t.Fatalf("version extra: exit %d, printed %q", code, out.String())
	}
}
