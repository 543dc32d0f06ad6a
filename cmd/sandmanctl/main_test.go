package main

import (
	"errors"
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
