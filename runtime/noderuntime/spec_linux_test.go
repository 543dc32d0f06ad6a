package noderuntime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandman-dev/sandman/runtime"
)

// spec is containerd's default spec for a container run as uid:gid, with
// opts applied.
func spec(t *testing.T, uid, gid uint32, opts ...oci.SpecOpts) (*oci.Spec, error) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	asUser := func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.User = specs.User{UID: uid, GID: gid, AdditionalGids: []uint32{gid}}
		return nil
	}
	return oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c"}, append([]oci.SpecOpts{asUser}, opts...)...)
}

func mustSpec(t *testing.T, c runtime.ContainerSpec, nodePids int64, seccompRoot string) *oci.Spec {
	t.Helper()
	opts, err := securityOpts(c, nodePids, seccompRoot)
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec(t, 1000, 1000, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSandboxCapabilities: the contract's set is containerd's default
// without the four capabilities sandboxes never get.
func TestSandboxCapabilities(t *testing.T) {
	s, err := spec(t, 0, 0, oci.WithDroppedCapabilities([]string{"CAP_NET_RAW", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}))
	if err != nil {
		t.Fatal(err)
	}
	got, want := slices.Sorted(slices.Values(s.Process.Capabilities.Bounding)), slices.Sorted(slices.Values(runtime.SandboxCapabilities))
	if !slices.Equal(got, want) {
		t.Fatalf("containerd's default without the dropped four is %v; runtime.SandboxCapabilities is %v", got, want)
	}
	d := mustSpec(t, runtime.ContainerSpec{}, 1024, "")
	if caps := d.Process.Capabilities; !slices.Equal(caps.Bounding, runtime.SandboxCapabilities) || !slices.Equal(caps.Effective, runtime.SandboxCapabilities) ||
		!slices.Equal(caps.Permitted, runtime.SandboxCapabilities) || len(caps.Inheritable) > 0 || len(caps.Ambient) > 0 {
		t.Fatalf("default capabilities %+v", caps)
	}
	if d.Linux.Seccomp == nil || d.Linux.Seccomp.DefaultAction == "" {
		t.Fatal("no default seccomp profile")
	}
	if *d.Linux.Resources.Pids.Limit != 1024 || d.Root.Readonly {
		t.Fatalf("pids %d, read-only root %v: want the node's 1024 and a writable root", *d.Linux.Resources.Pids.Limit, d.Root.Readonly)
	}
}

func TestSecurityOpts(t *testing.T) {
	drop := mustSpec(t, runtime.ContainerSpec{DropCapabilities: []string{"CAP_KILL", "CAP_CHOWN"}}, 0, "")
	for _, l := range [][]string{drop.Process.Capabilities.Bounding, drop.Process.Capabilities.Effective, drop.Process.Capabilities.Permitted} {
		if slices.Contains(l, "CAP_KILL") || slices.Contains(l, "CAP_CHOWN") || len(l) != len(runtime.SandboxCapabilities)-2 {
			t.Fatalf("dropped CAP_KILL and CAP_CHOWN: %v", l)
		}
	}
	all := mustSpec(t, runtime.ContainerSpec{DropCapabilities: []string{"ALL"}}, 0, "")
	if caps := all.Process.Capabilities; len(caps.Bounding)+len(caps.Effective)+len(caps.Permitted)+len(caps.Inheritable) != 0 {
		t.Fatalf("dropped ALL: %+v", caps)
	}

	g := int64(4242)
	grp := mustSpec(t, runtime.ContainerSpec{Group: &g, SupplementalGroups: []int64{7, 8, 7}}, 0, "")
	if u := grp.Process.User; u.UID != 1000 || u.GID != 4242 || !slices.Equal(u.AdditionalGids, []uint32{4242, 7, 8}) {
		t.Fatalf("group 4242 and supplemental 7, 8 over 1000:1000: %+v", u)
	}

	ro := mustSpec(t, runtime.ContainerSpec{ReadOnlyRootFS: true, PidsLimit: 100}, 1024, "")
	if !ro.Root.Readonly || *ro.Linux.Resources.Pids.Limit != 100 {
		t.Fatalf("read-only %v, pids %d: want true and the pod's 100", ro.Root.Readonly, *ro.Linux.Resources.Pids.Limit)
	}
	if p := mustSpec(t, runtime.ContainerSpec{PidsLimit: 4096}, 1024, ""); *p.Linux.Resources.Pids.Limit != 1024 {
		t.Fatalf("pids %d: want the node's 1024, the lower", *p.Linux.Resources.Pids.Limit)
	}

	// runAsNonRoot is checked against the user the spec ends with.
	opts, err := securityOpts(runtime.ContainerSpec{Name: "main", RunAsNonRoot: true}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spec(t, 1000, 1000, opts...); err != nil {
		t.Fatalf("runAsNonRoot as uid 1000: %v", err)
	}
	if _, err := spec(t, 0, 1000, opts...); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("runAsNonRoot as uid 0: %v, want InvalidArgument", err)
	}
}

func TestSeccompLocalhost(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "seccomp")
	if err := os.MkdirAll(filepath.Join(root, "profiles"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"profiles/audit.json": `{"defaultAction": "SCMP_ACT_LOG", "syscalls": [{"names": ["mount"], "action": "SCMP_ACT_ERRNO"}]}`,
		"bad.json":            `{"defaultAction":`,
		"empty.json":          `{}`,
		"../outside.json":     `{"defaultAction": "SCMP_ACT_ALLOW"}`,
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../outside.json", filepath.Join(root, "escape.json")); err != nil {
		t.Fatal(err)
	}
	s := mustSpec(t, runtime.ContainerSpec{SeccompLocalhost: "profiles/audit.json"}, 0, root)
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != "SCMP_ACT_LOG" || len(s.Linux.Seccomp.Syscalls) != 1 {
		t.Fatalf("Localhost profile: %+v", s.Linux.Seccomp)
	}
	for _, name := range []string{"missing.json", "bad.json", "empty.json", "escape.json"} {
		_, err := securityOpts(runtime.ContainerSpec{Name: "main", SeccompLocalhost: name}, 0, root)
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("profile %s: %v, want InvalidArgument", name, err)
		}
	}
}

// TestGVisorSeccomp: for gVisor, whose filter answers errno rules with
// EPERM, the default profile's clone3 (ENOSYS, so glibc falls back to
// clone) becomes a trace rule, which gVisor answers with ENOSYS; the other
// rules stay as they were.
func TestGVisorSeccomp(t *testing.T) {
	s := mustSpec(t, runtime.ContainerSpec{Name: "c"}, 0, "")
	before := len(s.Linux.Seccomp.Syscalls)
	if err := withGVisorSeccomp(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Seccomp.Syscalls) != before {
		t.Fatalf("%d rules, had %d", len(s.Linux.Seccomp.Syscalls), before)
	}
	found := false
	for _, sc := range s.Linux.Seccomp.Syscalls {
		if slices.Contains(sc.Names, "clone3") && sc.Action != specs.ActAllow {
			found = true
			if sc.Action != specs.ActTrace || sc.ErrnoRet != nil {
				t.Errorf("clone3's rule: %s %v, want a trace rule", sc.Action, sc.ErrnoRet)
			}
		}
		if sc.Action == specs.ActErrno && sc.ErrnoRet != nil && *sc.ErrnoRet == 38 {
			t.Errorf("an ENOSYS rule is left for %v", sc.Names)
		}
	}
	if !found {
		t.Fatal("the default profile has no clone3 rule: the test no longer checks anything")
	}
}
