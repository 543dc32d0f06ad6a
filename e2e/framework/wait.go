package framework

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Eventually polls cond every interval until it returns true, failing the
// test with what when timeout passes or cond returns an error.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx := t.Context()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, cond)
	if err != nil {
		t.Fatalf("waiting %v for %s: %v", timeout, what, err)
	}
}
