package main

import "testing"

func TestSplitRemote(t *testing.T) {
	for _, tc := range []struct {
		in         string
		name, path string
		remote     bool
	}{
		{"box:/tmp/x", "box", "/tmp/x", true},
		{"./local", "", "./local", false},
		{"/abs/local", "", "/abs/local", false},
		{"dir/with:colon", "", "dir/with:colon", false},
		{"box:relative", "", "box:relative", false},
	} {
		name, path, remote := splitRemote(tc.in)
		if name != tc.name || path != tc.path || remote != tc.remote {
			t.Errorf("splitRemote(%q) = %q %q %v", tc.in, name, path, remote)
		}
	}
}
