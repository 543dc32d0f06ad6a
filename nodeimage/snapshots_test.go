package nodeimage

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseSnapshotRepositories(t *testing.T) {
	for _, v := range []string{"registry.example.com:5000/sandman/e2b", "localhost:5000", "reg.example/e2b", "[::1]:5000/snap"} {
		if _, err := ParseSnapshotRepositories([]string{v}); err != nil {
			t.Errorf("%q: %v", v, err)
		}
	}
	for _, v := range []string{"", "e2b", "e2b/snap", "reg.example/e2b/", "reg.example/E2B", "reg.example/e2b:tag", "reg.example/e2b@sha256:" + strings.Repeat("a", 64), "https://reg.example/e2b"} {
		if _, err := ParseSnapshotRepositories([]string{v}); err == nil || !strings.Contains(err.Error(), "host[:port][/prefix]") {
			t.Errorf("%q: %v, want a refusal saying host[:port][/prefix]", v, err)
		}
	}
}

func TestSnapshotOwner(t *testing.T) {
	s, err := ParseSnapshotRepositories([]string{"reg.example:5000/sandman", "reg.example:5000/sandman/e2b", "snap.example/e2b", "root.example:5000"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ref, owner string
	}{
		{"reg.example:5000/sandman/e2b/team-b/prep:v1", "team-b"},
		{"reg.example:5000/sandman/e2b/team-b/prep@sha256:" + strings.Repeat("a", 64), "team-b"},
		{"reg.example:5000/sandman/e2b/team-b:v1", "team-b"},
		// The deepest repository decides.
		{"reg.example:5000/sandman/team-a/prep", "team-a"},
		{"reg.example:5000/sandman/e2b:v1", "e2b"},
		// Host case, the HTTPS port, and the same registry by address.
		{"REG.example:5000/sandman/e2b/team-b/prep:v1", "team-b"},
		{"snap.example:443/e2b/team-b/prep:v1", "team-b"},
		{"127.0.0.1:5000/sandman/e2b/team-b/prep:v1", "team-b"},
		{"localhost:5000/sandman/e2b/team-b/prep:v1", "team-b"},
		{"[::1]:5000/sandman/e2b/team-b/prep:v1", "team-b"},
		{"10.96.0.9/e2b/team-b/prep:v1", "team-b"},
		// A repository without a prefix: the first component.
		{"root.example:5000/team-c/prep:v1", "team-c"},
		// Not snapshots.
		{"reg.example:5000/other/team-b/prep:v1", ""},
		{"reg.example:5001/sandman/e2b/team-b/prep:v1", ""},
		{"127.0.0.1:5001/sandman/e2b/team-b/prep:v1", ""},
		{"other.example:5000/sandman/e2b/team-b/prep:v1", ""},
		{"snap.example/e2bx/team-b/prep:v1", ""},
		{"snap.example/e2b:v1", ""},
		{"docker.io/e2b/team-b/prep:v1", ""},
		{"e2b/team-b/prep:v1", ""},
		{"busybox", ""},
		{"not a reference", ""},
	} {
		owner, _, ok := s.Owner(tc.ref)
		if owner != tc.owner || ok != (tc.owner != "") {
			t.Errorf("Owner(%q) = %q, %v; want %q", tc.ref, owner, ok, tc.owner)
		}
	}
}

func TestSnapshotCheckStart(t *testing.T) {
	s, err := ParseSnapshotRepositories([]string{"reg.example:5000/sandman/e2b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ref, namespace string
		refused        bool
	}{
		{"reg.example:5000/sandman/e2b/team-a/prep:v1", "team-a", false},
		{"reg.example:5000/sandman/e2b/team-b/prep:v1", "team-a", true},
		{"127.0.0.1:5000/sandman/e2b/team-b/prep:v1", "team-a", true},
		{"reg.example:5000/sandman/e2b/team-b/prep:v1", "", true},
		{"reg.example:5000/sandman/base:v1", "team-a", false},
		{"busybox", "team-a", false},
	} {
		err := s.CheckStart(tc.ref, tc.namespace)
		if !tc.refused {
			if err != nil {
				t.Errorf("%s for namespace %q: %v, want allowed", tc.ref, tc.namespace, err)
			}
			continue
		}
		if KindOf(err) != KindForbidden || !errdefs.IsPermissionDenied(err) {
			t.Errorf("%s for namespace %q: %v, want KindForbidden (PermissionDenied)", tc.ref, tc.namespace, err)
			continue
		}
		var e *Error
		if errors.As(err, &e); e.Retryable() {
			t.Errorf("%s: a refusal of another namespace's snapshot is retryable", tc.ref)
		}
		for _, want := range []string{"is a snapshot of namespace team-b", "pods of namespace " + tc.namespace + " cannot start it", "reg.example:5000/sandman/e2b/" + tc.namespace + "/"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s for namespace %q: %q does not say %q", tc.ref, tc.namespace, err, want)
			}
		}
	}
	// No repositories: nothing is anyone's.
	if err := (SnapshotRepositories{}).CheckStart("reg.example:5000/sandman/e2b/team-b/prep:v1", "team-a"); err != nil {
		t.Errorf("no repositories: %v", err)
	}
}

func TestSnapshotCheckWrite(t *testing.T) {
	s, err := ParseSnapshotRepositories([]string{"reg.example:5000/sandman/e2b", "reg.example:5000/sandman/own"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ref, namespace string
		want           string // "" allowed, else part of the refusal
	}{
		{"reg.example:5000/sandman/e2b/team-a/prep:v1", "team-a", ""},
		{"reg.example:5000/sandman/own/team-a:v1", "team-a", ""},
		{"reg.example:5000/sandman/e2b/team-b/prep:v1", "team-a", "under namespace team-b's snapshots"},
		{"reg.example:5000/sandman/e2b/team-b/prep:v1", "", "under namespace team-b's snapshots"},
		{"reg.example:5000/sandman/prep:v1", "team-a", "reg.example:5000/sandman/e2b/team-a/ or reg.example:5000/sandman/own/team-a/"},
	} {
		err := s.CheckWrite(tc.ref, tc.namespace)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s for namespace %q: %v, want allowed", tc.ref, tc.namespace, err)
		case tc.want != "" && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s for namespace %q: %v, want InvalidArgument saying %q", tc.ref, tc.namespace, err, tc.want)
		}
	}
	if err := (SnapshotRepositories{}).CheckWrite("reg.example:5000/sandman/e2b/team-b/prep:v1", "team-a"); err != nil {
		t.Errorf("no repositories: %v", err)
	}
}

// TestAuthorizePodSnapshot: another namespace's snapshot is refused whether
// it is on the node (and public there) or not, with or without secrets;
// the owner's pods get it, with no containerd call.
func TestAuthorizePodSnapshot(t *testing.T) {
	s, err := ParseSnapshotRepositories([]string{"reg.example:5000/sandman/e2b"})
	if err != nil {
		t.Fatal(err)
	}
	cached := "reg.example:5000/sandman/e2b/team-b/cached:v1"
	m := &Manager{snapshots: s, images: map[string]*entry{cached: {access: AccessPublic}}}
	secrets := [][]byte{[]byte(`{"auths":{"reg.example:5000":{"username":"u","password":"p"}}}`)}
	for _, ref := range []string{cached, "reg.example:5000/sandman/e2b/team-b/absent:v1"} {
		for _, sec := range [][][]byte{nil, secrets} {
			if err := m.AuthorizePod(t.Context(), ref, "team-a", sec); KindOf(err) != KindForbidden {
				t.Errorf("%s for team-a (secrets: %v): %v, want KindForbidden", ref, sec != nil, err)
			}
			if err := m.AuthorizePod(t.Context(), ref, "team-b", sec); err != nil {
				t.Errorf("%s for its own namespace (secrets: %v): %v", ref, sec != nil, err)
			}
		}
	}
}
