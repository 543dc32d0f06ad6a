package main

import (
	"slices"
	"testing"
)

func TestNamespaceList(t *testing.T) {
	for _, tc := range []struct {
		one, many string
		want      []string
		bad       bool
	}{
		{"", "", nil, false},
		{"team-a", "", []string{"team-a"}, false},
		{"", "team-a, team-b,,team-a", []string{"team-a", "team-b"}, false},
		{"team-c", "team-a", []string{"team-a", "team-c"}, false},
		{"", "Team_A", nil, true},
	} {
		got, err := namespaceList(tc.one, tc.many)
		if (err != nil) != tc.bad || !slices.Equal(got, tc.want) {
			t.Errorf("namespaceList(%q, %q) = %v, %v; want %v (error: %v)", tc.one, tc.many, got, err, tc.want, tc.bad)
		}
	}
}

// TestVersionFlag: --version answers before the flags are checked, with
// no credentials or cluster.
func TestVersionFlag(t *testing.T) {
	if err := run([]string{"--version"}); err != nil {
		t.Fatalf("run(--version): %v", err)
	}
}
