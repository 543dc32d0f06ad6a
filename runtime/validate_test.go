package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestValidateSecurity: the node agent refuses a container whose security
// settings a sandbox cannot honour safely, and accepts the ones it honours.
func TestValidateSecurity(t *testing.T) {
	gid := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name string
		c    ContainerSpec
		want string // "": accepted
	}{
		{name: "defaults", c: ContainerSpec{}},
		{name: "uid", c: ContainerSpec{User: "1000"}},
		{name: "uid and gid", c: ContainerSpec{User: "1000:2000", RunAsNonRoot: true}},
		{name: "group alone", c: ContainerSpec{Group: gid(0), SupplementalGroups: []int64{5, 6}}},
		{name: "narrowing", c: ContainerSpec{ReadOnlyRootFS: true, DropCapabilities: []string{"ALL", "CAP_KILL"},
			SeccompLocalhost: "profiles/audit.json", PidsLimit: 64}},
		{name: "user name", c: ContainerSpec{User: "root"}, want: "numeric uid"},
		{name: "group name", c: ContainerSpec{User: "1:wheel"}, want: "numeric uid"},
		{name: "negative uid", c: ContainerSpec{User: "-1"}, want: "out of range"},
		{name: "huge gid", c: ContainerSpec{Group: gid(1 << 40)}, want: "out of range"},
		{name: "user and group", c: ContainerSpec{User: "1", Group: gid(2)}, want: "uid:gid"},
		{name: "negative supplemental group", c: ContainerSpec{SupplementalGroups: []int64{-3}}, want: "supplemental gid"},
		{name: "non-root as root", c: ContainerSpec{User: "0:0", RunAsNonRoot: true}, want: "runAsNonRoot"},
		{name: "bad capability", c: ContainerSpec{DropCapabilities: []string{"net_raw"}}, want: "CAP_"},
		{name: "absolute seccomp profile", c: ContainerSpec{SeccompLocalhost: "/etc/shadow"}, want: "seccomp profile"},
		{name: "seccomp profile outside", c: ContainerSpec{SeccompLocalhost: "a/../../x.json"}, want: "seccomp profile"},
		{name: "negative pids limit", c: ContainerSpec{PidsLimit: -1}, want: "pids limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			c.Name, c.Image = "main", "img"
			req := BindRequest{Pod: PodRef{UID: "u1"}, Containers: []ContainerSpec{c}, AllowUnauthenticated: true}
			err := req.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"main"`)):
				t.Fatalf("err = %v, want InvalidArgument naming the container and saying %q", err, tc.want)
			}
		})
	}
}

// TestDefaultSecurity: any narrowing or user setting, and leaving
// no_new_privs off, keeps a container off a hot slot's sandbox.
func TestDefaultSecurity(t *testing.T) {
	g := int64(5)
	if !(ContainerSpec{Name: "a", Image: "i", PidsLimit: 100, Env: []string{"A=1"}}).DefaultSecurity() {
		t.Fatal("a container without security settings is not default")
	}
	for _, c := range []ContainerSpec{
		{User: "1"}, {Group: &g}, {SupplementalGroups: []int64{1}}, {RunAsNonRoot: true},
		{ReadOnlyRootFS: true}, {DropCapabilities: []string{"CAP_KILL"}}, {SeccompLocalhost: "p.json"},
		{AllowPrivilegeEscalation: true},
	} {
		if c.DefaultSecurity() {
			t.Errorf("%+v counts as default", c)
		}
	}
}

// TestRootOtherwiseDefault: root (uid 0, with or without gid 0) and
// nothing else may take a hot sandbox that runs as root; another user or
// group, or any narrowing beside root, may not.
func TestRootOtherwiseDefault(t *testing.T) {
	zero, five := int64(0), int64(5)
	for _, c := range []ContainerSpec{{User: "0"}, {User: "0:0"}, {User: "0", Group: &zero}} {
		if !c.RootOtherwiseDefault() {
			t.Errorf("%+v: not root otherwise default", c)
		}
	}
	for _, c := range []ContainerSpec{
		{}, {User: "1"}, {User: "0:5"}, {User: "0", Group: &five}, {Group: &zero},
		{User: "0", ReadOnlyRootFS: true}, {User: "0", AllowPrivilegeEscalation: true}, {User: "0", SupplementalGroups: []int64{1}},
	} {
		if c.RootOtherwiseDefault() {
			t.Errorf("%+v counts as root otherwise default", c)
		}
	}
}

// TestValidateRuntimeHandler: runc (or none) and runsc are the handlers a
// sandbox runs under; any other is refused by name.
func TestValidateRuntimeHandler(t *testing.T) {
	for _, h := range []string{"", RuntimeHandlerRunc, RuntimeHandlerRunsc} {
		req := BindRequest{Pod: PodRef{UID: "u1"}, Containers: []ContainerSpec{{Name: "main", Image: "img"}}, AllowUnauthenticated: true, RuntimeHandler: h}
		if err := req.Validate(); err != nil {
			t.Errorf("handler %q refused: %v", h, err)
		}
		if got, want := req.GVisor(), h == RuntimeHandlerRunsc; got != want {
			t.Errorf("handler %q: GVisor() = %v, want %v", h, got, want)
		}
	}
	req := BindRequest{Pod: PodRef{UID: "u1"}, Containers: []ContainerSpec{{Name: "main", Image: "img"}}, AllowUnauthenticated: true, RuntimeHandler: "kata"}
	if err := req.Validate(); err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"kata"`) {
		t.Fatalf("handler kata: err = %v, want InvalidArgument naming it", err)
	}
}

// TestValidateEgress: the pod's egress narrowing and its denied ranges are
// IPv4 CIDRs, its allowed names DNS names (a wildcard only as a whole
// first label), at most 64; anything else is refused naming the list and
// the value.
func TestValidateEgress(t *testing.T) {
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("n%d.example.com", i)
	}
	for _, tc := range []struct {
		name                  string
		egress, deny, domains []string
		want                  string // "": accepted
	}{
		{name: "names", domains: []string{"api.example.com", "*.pypi.org"}},
		{name: "names beside CIDRs", egress: []string{"203.0.113.0/24"}, domains: []string{"api.example.com"}},
		{name: "uppercase name", domains: []string{"API.example.com"}, want: `egress domains: name "API.example.com"`},
		{name: "name with a trailing dot", domains: []string{"example.com."}, want: `egress domains: name "example.com."`},
		{name: "wildcard inside", domains: []string{"a.*.example.com"}, want: `egress domains: name "a.*.example.com"`},
		{name: "address as a name", domains: []string{"203.0.113.9"}, want: `egress domains: name "203.0.113.9"`},
		{name: "too many names", domains: many, want: "egress domains: 65 names"},
		{name: "none"},
		{name: "narrowed", egress: []string{"203.0.113.0/24", "198.51.100.7/32"}},
		{name: "denied", deny: []string{"203.0.113.0/24", "198.51.100.7/32"}},
		{name: "no egress at all", deny: []string{"0.0.0.0/0"}},
		{name: "both", egress: []string{"203.0.113.0/24"}, deny: []string{"203.0.113.9/32"}},
		{name: "unmasked", deny: []string{"203.0.113.9/24"}},
		{name: "egress address", egress: []string{"203.0.113.9"}, want: `egress "203.0.113.9"`},
		{name: "deny address", deny: []string{"203.0.113.9"}, want: `egress deny "203.0.113.9"`},
		{name: "deny IPv6", deny: []string{"2001:db8::/32"}, want: `egress deny "2001:db8::/32"`},
		{name: "deny garbage", deny: []string{"none"}, want: `egress deny "none"`},
		{name: "deny empty", deny: []string{""}, want: `egress deny ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := BindRequest{Pod: PodRef{UID: "u1"}, Containers: []ContainerSpec{{Name: "main", Image: "img"}}, AllowUnauthenticated: true,
				Egress: tc.egress, EgressDeny: tc.deny, EgressDomains: tc.domains}
			err := req.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "u1")):
				t.Fatalf("err = %v, want InvalidArgument naming the pod and saying %q", err, tc.want)
			}
		})
	}
}

// TestValidateRestore: a moved sandbox is restored under gVisor, in one
// container, from a checkpoint named by digest, and not as a fork too;
// the checkpoint is the pod's own (<repository>/<namespace>/<pod>), never
// another namespace's or pod's.
func TestValidateRestore(t *testing.T) {
	const dgst = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	base := func() BindRequest {
		return BindRequest{Pod: PodRef{UID: "u1", Namespace: "ns", Name: "p"}, Containers: []ContainerSpec{{Name: "main", Image: "img"}},
			AllowUnauthenticated: true, RuntimeHandler: RuntimeHandlerRunsc, Restore: &MovedCheckpoint{Ref: "reg:5000/ckpt/ns/p" + dgst}}
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("a valid restore refused: %v", err)
	}
	for name, mutate := range map[string]func(*BindRequest){
		"runc":                func(r *BindRequest) { r.RuntimeHandler = RuntimeHandlerRunc },
		"two":                 func(r *BindRequest) { r.Containers = append(r.Containers, ContainerSpec{Name: "side", Image: "img"}) },
		"fork too":            func(r *BindRequest) { r.Fork = &ForkSource{PodUID: "u0", ID: "a"} },
		"tag":                 func(r *BindRequest) { r.Restore.Ref = "reg:5000/ckpt/ns/p:moved-u1" },
		"no ref":              func(r *BindRequest) { r.Restore.Ref = "" },
		"another namespace's": func(r *BindRequest) { r.Restore.Ref = "reg:5000/ckpt/other/p" + dgst },
		"another pod's":       func(r *BindRequest) { r.Restore.Ref = "reg:5000/ckpt/ns/q" + dgst },
		"a longer namespace":  func(r *BindRequest) { r.Restore.Ref = "reg:5000/ckpt/xns/p" + dgst },
		"a pod's prefix":      func(r *BindRequest) { r.Restore.Ref = "reg:5000/ckpt/ns/p/x" + dgst },
		"no repository":       func(r *BindRequest) { r.Restore.Ref = "ns/p" + dgst },
		"no namespace":        func(r *BindRequest) { r.Pod.Namespace, r.Restore.Ref = "", "reg:5000/ckpt//p"+dgst },
	} {
		r := base()
		mutate(&r)
		if err := r.Validate(); err == nil || !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
}
