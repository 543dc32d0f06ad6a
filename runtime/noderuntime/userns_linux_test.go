package noderuntime

import (
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// TestUserNSPolicy: a pod's hostUsers decides when it says; the node's
// policy when not; a node that requires user namespaces refuses true.
func TestUserNSPolicy(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		mode      UserNamespaces
		hostUsers *bool
		want      bool
		refused   bool
	}{
		{UserNamespacesOff, nil, false, false},
		{UserNamespacesOff, &no, true, false},
		{UserNamespacesOff, &yes, false, false},
		{UserNamespacesOn, nil, true, false},
		{UserNamespacesOn, &no, true, false},
		{UserNamespacesOn, &yes, false, false},
		{UserNamespacesRequired, nil, true, false},
		{UserNamespacesRequired, &no, true, false},
		{UserNamespacesRequired, &yes, false, true},
	} {
		r := &Runtime{cfg: Config{UserNamespaces: tc.mode}}
		got, err := r.userNS(runtime.BindRequest{Pod: runtime.PodRef{UID: "u"}, HostUsers: tc.hostUsers})
		if tc.refused != errdefs.IsInvalidArgument(err) || (err == nil && got != tc.want) {
			t.Errorf("%s, hostUsers %v: %v, %v; want %v (refused %v)", tc.mode, tc.hostUsers, got, err, tc.want, tc.refused)
		}
	}
}

// TestIDRanges: slots take the lowest range no other slot holds and keep it.
func TestIDRanges(t *testing.T) {
	r := &Runtime{cfg: Config{UserNamespaceBase: 1 << 31}, slots: map[string]*slot{}}
	a, b, c := &slot{}, &slot{}, &slot{}
	r.slots["a"], r.slots["b"] = a, b
	if got, _ := r.idBaseLocked(a); got != 1<<31 {
		t.Fatalf("first range %d", got)
	}
	if got, _ := r.idBaseLocked(b); got != 1<<31+idsPerSandbox {
		t.Fatalf("second range %d", got)
	}
	if got, _ := r.idBaseLocked(a); got != 1<<31 {
		t.Fatalf("a slot's range moved: %d", got)
	}
	delete(r.slots, "a")
	r.slots["c"] = c
	if got, _ := r.idBaseLocked(c); got != 1<<31 {
		t.Fatalf("a freed range is not reused: %d", got)
	}
	// No room below 2^32: an error, not a wrapped id.
	r = &Runtime{cfg: Config{UserNamespaceBase: 1<<32 - idsPerSandbox}, slots: map[string]*slot{"a": a}}
	a.idBase = 0
	if _, err := r.idBaseLocked(a); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("past 2^32: %v", err)
	}
}

func TestRuncVersion(t *testing.T) {
	for out, want := range map[string][2]int{
		"runc version 1.5.3\ncommit: v1.5.3\n":          {1, 5},
		"runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1\n": {1, 1},
		"runc version 1.2.0-rc.1\nspec: 1.2.0\n":        {1, 2},
	} {
		major, minor, ok := runcVersion(out)
		if !ok || [2]int{major, minor} != want {
			t.Errorf("%q: %d.%d %v, want %v", out, major, minor, ok, want)
		}
	}
	if _, _, ok := runcVersion("crun version 1.8"); ok {
		t.Error("crun taken for runc")
	}
}

// TestWithinIDMap: ids a sandbox's user namespace does not map are refused.
func TestWithinIDMap(t *testing.T) {
	if _, err := spec(t, 1000, 1000, withinIDMap("c")); err != nil {
		t.Fatal(err)
	}
	if _, err := spec(t, 70000, 0, withinIDMap("c")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("uid 70000: %v", err)
	}
	if _, err := spec(t, 0, 65536, withinIDMap("c")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("gid 65536: %v", err)
	}
}
