package framework

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Eventually polls cond every 100 ms until it returns true, failing the
// test with what when timeout passes or cond returns an error. It works in
// cleanups too (it does not use the test's context, which ends before them).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx := context.Background()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, cond)
	if err != nil {
		t.Fatalf("waiting %v for %s: %v", timeout, what, err)
	}
}
