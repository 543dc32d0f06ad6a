package main

import "testing"

// TestVersionFlag: --version answers before the flags are checked, with
// no credentials or cluster.
func TestVersionFlag(t *testing.T) {
	if err := run([]string{"--version"}); err != nil {
		t.Fatalf("run(--version): %v", err)
	}
}
