package vk

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	nodev1listers "k8s.io/client-go/listers/node/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/runtime"
)

// translator is a provider that only translates pods (as the fuzz tests
// build it: New would start the status workers).
func translator(mutate ...func(*Config)) *Provider {
	cfg := Config{NodeName: "vn"}
	for _, m := range mutate {
		m(&cfg)
	}
	return &Provider{cfg: cfg, log: slog.New(slog.DiscardHandler)}
}

func sc(mutate func(*corev1.SecurityContext)) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Spec.Containers[0].SecurityContext == nil {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{}
		}
		mutate(p.Spec.Containers[0].SecurityContext)
	}
}

func psc(mutate func(*corev1.PodSecurityContext)) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Spec.SecurityContext == nil {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{}
		}
		mutate(p.Spec.SecurityContext)
	}
}

func volume(name string, src corev1.VolumeSource) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: src})
	}
}

// TestRefusedPodFields: a field a sandbox cannot run safely fails the pod,
// with a message naming the field.
func TestRefusedPodFields(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*corev1.Pod)
		want   string
	}{
		{"privileged", sc(func(s *corev1.SecurityContext) { s.Privileged = ptr.To(true) }), "securityContext.privileged"},
		{"capability added", sc(func(s *corev1.SecurityContext) {
			s.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"KILL", "NET_ADMIN"}}
		}), "capabilities.add: NET_ADMIN"},
		{"dropped capability added back", sc(func(s *corev1.SecurityContext) {
			s.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"CAP_NET_RAW"}}
		}), "capabilities.add: CAP_NET_RAW"},
		{"allowPrivilegeEscalation", sc(func(s *corev1.SecurityContext) { s.AllowPrivilegeEscalation = ptr.To(true) }), "allowPrivilegeEscalation"},
		{"procMount Unmasked", sc(func(s *corev1.SecurityContext) { s.ProcMount = ptr.To(corev1.UnmaskedProcMount) }), "procMount"},
		{"seccomp Unconfined", sc(func(s *corev1.SecurityContext) {
			s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}), "securityContext.seccompProfile"},
		{"pod seccomp Unconfined", psc(func(s *corev1.PodSecurityContext) {
			s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}), "spec.securityContext.seccompProfile"},
		{"seccomp Localhost outside", sc(func(s *corev1.SecurityContext) {
			s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("../x.json")}
		}), "localhostProfile"},
		{"AppArmor Unconfined", psc(func(s *corev1.PodSecurityContext) {
			s.AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
		}), "spec.securityContext.appArmorProfile"},
		{"AppArmor annotation", func(p *corev1.Pod) {
			p.Annotations["container.apparmor.security.beta.kubernetes.io/task"] = "unconfined"
		}, "container.apparmor.security.beta.kubernetes.io/task"},
		{"SELinux spc_t", sc(func(s *corev1.SecurityContext) { s.SELinuxOptions = &corev1.SELinuxOptions{Type: "spc_t"} }), "seLinuxOptions"},
		{"runAsNonRoot as root", sc(func(s *corev1.SecurityContext) { s.RunAsUser, s.RunAsNonRoot = ptr.To[int64](0), ptr.To(true) }), "runAsNonRoot"},
		{"hostProcess", sc(func(s *corev1.SecurityContext) {
			s.WindowsOptions = &corev1.WindowsSecurityContextOptions{HostProcess: ptr.To(true)}
		}), "windowsOptions.hostProcess"},
		{"sysctls", psc(func(s *corev1.PodSecurityContext) {
			s.Sysctls = []corev1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}}
		}), "sysctls"},
		{"hostNetwork", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "spec.hostNetwork"},
		{"runtimeClassName", func(p *corev1.Pod) { rc := "gvisor"; p.Spec.RuntimeClassName = &rc }, "spec.runtimeClassName"},
		{"hostPID", func(p *corev1.Pod) { p.Spec.HostPID = true }, "spec.hostPID"},
		{"hostIPC", func(p *corev1.Pod) { p.Spec.HostIPC = true }, "spec.hostIPC"},
		{"hostPath volume", volume("root", corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}), "spec.volumes[root].hostPath"},
		{"persistent volume", volume("data", corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}),
			"spec.volumes[data].persistentVolumeClaim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("bad", "img")
			tc.mutate(pod)
			_, err := translator().bindRequest(pod)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestHonouredPodFields: what a sandbox honours reaches the node agent in
// the container's spec; what it ignores harmlessly does not fail the pod.
func TestHonouredPodFields(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*corev1.Pod)
		want   runtime.ContainerSpec // security fields only
	}{
		{"nothing", func(*corev1.Pod) {}, runtime.ContainerSpec{}},
		{"runAsUser", sc(func(s *corev1.SecurityContext) { s.RunAsUser = ptr.To[int64](1000) }), runtime.ContainerSpec{User: "1000"}},
		{"runAsUser and runAsGroup", psc(func(s *corev1.PodSecurityContext) {
			s.RunAsUser, s.RunAsGroup = ptr.To[int64](1000), ptr.To[int64](2000)
		}),
			runtime.ContainerSpec{User: "1000:2000"}},
		{"runAsGroup alone", sc(func(s *corev1.SecurityContext) { s.RunAsGroup = ptr.To[int64](0) }), runtime.ContainerSpec{Group: ptr.To[int64](0)}},
		{"container over pod", func(p *corev1.Pod) {
			psc(func(s *corev1.PodSecurityContext) { s.RunAsUser, s.RunAsGroup = ptr.To[int64](1), ptr.To[int64](2) })(p)
			sc(func(s *corev1.SecurityContext) { s.RunAsUser = ptr.To[int64](3) })(p)
		}, runtime.ContainerSpec{User: "3:2"}},
		{"runAsNonRoot", psc(func(s *corev1.PodSecurityContext) { s.RunAsNonRoot = ptr.To(true) }), runtime.ContainerSpec{RunAsNonRoot: true}},
		{"runAsNonRoot with a user", sc(func(s *corev1.SecurityContext) { s.RunAsNonRoot, s.RunAsUser = ptr.To(true), ptr.To[int64](1000) }),
			runtime.ContainerSpec{RunAsNonRoot: true, User: "1000"}},
		{"readOnlyRootFilesystem", sc(func(s *corev1.SecurityContext) { s.ReadOnlyRootFilesystem = ptr.To(true) }), runtime.ContainerSpec{ReadOnlyRootFS: true}},
		{"capabilities dropped", sc(func(s *corev1.SecurityContext) {
			s.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"kill", "CAP_CHOWN", "KILL"}}
		}), runtime.ContainerSpec{DropCapabilities: []string{"CAP_KILL", "CAP_CHOWN"}}},
		{"all capabilities dropped", sc(func(s *corev1.SecurityContext) {
			s.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"KILL", "ALL"}}
		}), runtime.ContainerSpec{DropCapabilities: []string{"ALL"}}},
		{"capability the sandbox has", sc(func(s *corev1.SecurityContext) {
			s.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE", "CAP_KILL"}}
		}), runtime.ContainerSpec{}},
		{"seccomp RuntimeDefault", sc(func(s *corev1.SecurityContext) {
			s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
		}), runtime.ContainerSpec{}},
		{"seccomp Localhost", psc(func(s *corev1.PodSecurityContext) {
			s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("profiles/strict.json")}
		}), runtime.ContainerSpec{SeccompLocalhost: "profiles/strict.json"}},
		{"container seccomp over pod Localhost", func(p *corev1.Pod) {
			psc(func(s *corev1.PodSecurityContext) {
				s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("p.json")}
			})(p)
			sc(func(s *corev1.SecurityContext) {
				s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
			})(p)
		}, runtime.ContainerSpec{}},
		{"allowPrivilegeEscalation false", sc(func(s *corev1.SecurityContext) { s.AllowPrivilegeEscalation = ptr.To(false) }), runtime.ContainerSpec{}},
		{"supplementalGroups, fsGroup ignored", psc(func(s *corev1.PodSecurityContext) {
			s.SupplementalGroups, s.FSGroup = []int64{10, 20}, ptr.To[int64](30)
		}), runtime.ContainerSpec{SupplementalGroups: []int64{10, 20}}},
		{"AppArmor RuntimeDefault", sc(func(s *corev1.SecurityContext) {
			s.AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeRuntimeDefault}
		}), runtime.ContainerSpec{}},
		{"SELinux level", sc(func(s *corev1.SecurityContext) { s.SELinuxOptions = &corev1.SELinuxOptions{Level: "s0:c1,c2"} }), runtime.ContainerSpec{}},
		{"ignored volumes", func(p *corev1.Pod) {
			volume("tmp", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}})(p)
			volume("token", corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}})(p)
		}, runtime.ContainerSpec{}},
		{"restricted", func(p *corev1.Pod) {
			psc(func(s *corev1.PodSecurityContext) {
				s.RunAsNonRoot = ptr.To(true)
				s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
			})(p)
			sc(func(s *corev1.SecurityContext) {
				s.AllowPrivilegeEscalation = ptr.To(false)
				s.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_BIND_SERVICE"}}
			})(p)
		}, runtime.ContainerSpec{RunAsNonRoot: true, DropCapabilities: []string{"ALL"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("ok", "img")
			tc.mutate(pod)
			req, err := translator(func(c *Config) { c.SeccompLocalhostProfiles = []string{"profiles/strict.json"} }).bindRequest(pod)
			if err != nil {
				t.Fatal(err)
			}
			got := req.Containers[0]
			got = runtime.ContainerSpec{User: got.User, Group: got.Group, SupplementalGroups: got.SupplementalGroups, RunAsNonRoot: got.RunAsNonRoot,
				ReadOnlyRootFS: got.ReadOnlyRootFS, DropCapabilities: got.DropCapabilities, SeccompLocalhost: got.SeccompLocalhost}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("security %+v, want %+v", got, tc.want)
			}
			if got.DefaultSecurity() != reflect.DeepEqual(tc.want, runtime.ContainerSpec{}) {
				t.Fatalf("DefaultSecurity = %v for %+v", got.DefaultSecurity(), got)
			}
		})
	}
}

// TestPoolLimits: a container without limits gets the pool's defaults (its
// request when larger); one above the maximum is refused naming container,
// resource, amount and maximum; every container carries the pids limit.
func TestPoolLimits(t *testing.T) {
	p := translator(func(c *Config) {
		c.DefaultLimits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("10Gi")}
		c.MaxLimits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("50Gi")}
		c.PidsLimit = 512
	})
	res := func(requests, limits corev1.ResourceList) func(*corev1.Pod) {
		return func(pod *corev1.Pod) {
			pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: requests, Limits: limits}
		}
	}
	rl := func(kv ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	for _, tc := range []struct {
		name     string
		mutate   func(*corev1.Pod)
		limits   runtime.Resources
		requests runtime.Resources
		disk     int64
		err      string
	}{
		{name: "none", mutate: res(nil, nil), limits: runtime.Resources{MilliCPU: 1000, MemoryBytes: 1 << 30}, disk: 10 << 30},
		{name: "requests below the defaults", mutate: res(rl("cpu", "100m", "memory", "64Mi"), nil),
			requests: runtime.Resources{MilliCPU: 100, MemoryBytes: 64 << 20}, limits: runtime.Resources{MilliCPU: 1000, MemoryBytes: 1 << 30}, disk: 10 << 30},
		{name: "requests above the defaults", mutate: res(rl("cpu", "3", "memory", "2Gi", "ephemeral-storage", "20Gi"), nil),
			requests: runtime.Resources{MilliCPU: 3000, MemoryBytes: 2 << 30}, limits: runtime.Resources{MilliCPU: 3000, MemoryBytes: 2 << 30}, disk: 20 << 30},
		{name: "own limits", mutate: res(nil, rl("cpu", "2", "memory", "512Mi", "ephemeral-storage", "1Gi")),
			requests: runtime.Resources{MilliCPU: 2000, MemoryBytes: 512 << 20}, limits: runtime.Resources{MilliCPU: 2000, MemoryBytes: 512 << 20}, disk: 1 << 30},
		{name: "limit above the maximum", mutate: res(nil, rl("memory", "16Gi")), err: `container "task": memory limit 16Gi is above the maximum 8Gi`},
		{name: "request above the maximum", mutate: res(rl("cpu", "8"), nil), err: `container "task": cpu request 8 is above the maximum 4`},
		{name: "disk above the maximum", mutate: res(nil, rl("ephemeral-storage", "100Gi")), err: `ephemeral-storage limit 100Gi is above the maximum 50Gi`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("p", "img")
			tc.mutate(pod)
			req, err := p.bindRequest(pod)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := req.Containers[0]
			if c.Limits != tc.limits || c.Requests != tc.requests || c.DiskBytes != tc.disk || c.PidsLimit != 512 {
				t.Fatalf("limits %+v requests %+v disk %d pids %d, want %+v %+v %d 512", c.Limits, c.Requests, c.DiskBytes, c.PidsLimit, tc.limits, tc.requests, tc.disk)
			}
		})
	}
	// Without pool limits, nothing is added.
	req, err := translator().bindRequest(testPod("p", "img"))
	if err != nil {
		t.Fatal(err)
	}
	if c := req.Containers[0]; c.Limits != (runtime.Resources{}) || c.DiskBytes != 0 || c.PidsLimit != 0 {
		t.Fatalf("no pool limits: %+v", c)
	}
}

func TestCheckPoolLimits(t *testing.T) {
	for _, tc := range []struct {
		def, ceiling corev1.ResourceList
		ok           bool
	}{
		{nil, nil, true},
		{corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}, true},
		{corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}, false},
		{corev1.ResourceList{corev1.ResourcePods: resource.MustParse("3")}, nil, false},
		{nil, corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("0")}, false},
	} {
		if err := checkPoolLimits(tc.def, tc.ceiling); (err == nil) != tc.ok {
			t.Errorf("checkPoolLimits(%v, %v) = %v", tc.def, tc.ceiling, err)
		}
	}
}

// TestHostUsers: the pod's hostUsers reaches the node agent as it is (nil
// leaves it to the node's --user-namespaces), but hostUsers: true, the
// opt-out of the user namespace, only from a namespace the pool names for
// it (HostUsersNamespaces); from any other the pod fails, naming the field.
func TestHostUsers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		v      *bool
		optOut []string
		err    bool
	}{
		{"unset", nil, nil, false},
		{"false", ptr.To(false), nil, false},
		{"true, no namespace named", ptr.To(true), nil, true},
		{"true, another namespace named", ptr.To(true), []string{"other"}, true},
		{"true, its namespace named", ptr.To(true), []string{"other", "ns"}, false},
		{"false, its namespace named", ptr.To(false), []string{"ns"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("ok", "img")
			pod.Spec.HostUsers = tc.v
			req, err := translator(func(c *Config) { c.HostUsersNamespaces = tc.optOut }).bindRequest(pod)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "spec.hostUsers") || !strings.Contains(err.Error(), "--host-users-namespaces") ||
					!strings.Contains(err.Error(), "not ns") {
					t.Fatalf("err = %v, want one naming spec.hostUsers, the namespace and --host-users-namespaces", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(req.HostUsers, tc.v) {
				t.Fatalf("HostUsers = %v, want %v", req.HostUsers, tc.v)
			}
		})
	}
}

// TestRuntimeClassHandler: a pod's runtimeClassName reaches the node agent
// as its RuntimeClass's handler, as a kubelet's CRI call carries it; runc
// and runsc (gVisor) are accepted, any other handler and a missing
// RuntimeClass fail the pod by name.
func TestRuntimeClassHandler(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, handler := range map[string]string{"gvisor": "runsc", "gke": "gvisor", "plain": "runc", "kata": "kata-qemu"} {
		if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler}); err != nil {
			t.Fatal(err)
		}
	}
	p := translator(func(c *Config) { c.RuntimeClasses = nodev1listers.NewRuntimeClassLister(idx) })
	for _, tc := range []struct {
		class, want, err string
	}{
		{"", "", ""},
		{"gvisor", runtime.RuntimeHandlerRunsc, ""},
		{"gke", runtime.RuntimeHandlerRunsc, ""},
		{"plain", "", ""},
		{"kata", "", `handler "kata-qemu"`},
		{"missing", "", `no RuntimeClass of that name`},
	} {
		pod := testPod("p", "img")
		if tc.class != "" {
			pod.Spec.RuntimeClassName = ptr.To(tc.class)
		}
		req, err := p.bindRequest(pod)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("class %q: %v", tc.class, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "spec.runtimeClassName")):
			t.Errorf("class %q: err = %v, want one naming spec.runtimeClassName and saying %q", tc.class, err, tc.err)
		case tc.err == "" && req.RuntimeHandler != tc.want:
			t.Errorf("class %q: handler %q, want %q", tc.class, req.RuntimeHandler, tc.want)
		}
	}
}

// TestSeccompLocalhostProfiles: a Localhost seccomp profile reaches the
// node agent only when the pool lists it (SeccompLocalhostProfiles); any
// other fails the pod, naming the field and the profiles the pool allows.
func TestSeccompLocalhostProfiles(t *testing.T) {
	localhost := func(path string) *corev1.SeccompProfile {
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To(path)}
	}
	for _, tc := range []struct {
		name    string
		allowed []string
		mutate  func(*corev1.Pod)
		want    string // SeccompLocalhost, when admitted
		err     []string
	}{
		{"none listed, none asked", nil, func(*corev1.Pod) {}, "", nil},
		{"none listed, RuntimeDefault", nil, sc(func(s *corev1.SecurityContext) {
			s.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
		}), "", nil},
		{"none listed", nil, sc(func(s *corev1.SecurityContext) { s.SeccompProfile = localhost("a.json") }), "",
			[]string{"spec.containers[task].securityContext.seccompProfile.localhostProfile", `"a.json"`, "allowed: none"}},
		{"listed", []string{"a.json", "sub/b.json"}, sc(func(s *corev1.SecurityContext) { s.SeccompProfile = localhost("sub/b.json") }), "sub/b.json", nil},
		{"listed, written otherwise", []string{"a.json"}, psc(func(s *corev1.PodSecurityContext) { s.SeccompProfile = localhost("./a.json") }), "./a.json", nil},
		{"not listed, on the pod", []string{"a.json", "sub/b.json"}, psc(func(s *corev1.PodSecurityContext) { s.SeccompProfile = localhost("permissive.json") }), "",
			[]string{"spec.securityContext.seccompProfile.localhostProfile", `"permissive.json"`, "pool vn", "allowed: a.json, sub/b.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("p", "img")
			tc.mutate(pod)
			req, err := translator(func(c *Config) { c.SeccompLocalhostProfiles = tc.allowed }).bindRequest(pod)
			if tc.err != nil {
				if err == nil {
					t.Fatal("admitted")
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := req.Containers[0].SeccompLocalhost; got != tc.want {
				t.Fatalf("SeccompLocalhost %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSeccompLocalhostProfilesConfig: a listed profile outside the node's
// profile directory is a configuration error.
func TestSeccompLocalhostProfilesConfig(t *testing.T) {
	h := newHarness(t, 1)
	for _, bad := range []string{"../x.json", "/etc/x.json", ""} {
		if _, err := New(Config{NodeName: "vn", Pool: h.pool, Client: h.client, SeccompLocalhostProfiles: []string{bad}}); err == nil ||
			!strings.Contains(err.Error(), "seccomp Localhost profile") {
			t.Errorf("%q: New = %v, want an error naming the profile", bad, err)
		}
	}
}

// TestPrivilegeEscalation: allowPrivilegeEscalation: true (no no_new_privs,
// so sudo works) reaches the node agent only from a namespace the pool
// names for it (PrivilegeEscalationNamespaces); from any other the pod
// fails, naming the field, the namespace and the flag. Unset and false
// keep no_new_privs.
func TestPrivilegeEscalation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v       *bool
		allowed []string
		err     bool
	}{
		{"unset", nil, nil, false},
		{"false", ptr.To(false), nil, false},
		{"true, no namespace named", ptr.To(true), nil, true},
		{"true, another namespace named", ptr.To(true), []string{"other"}, true},
		{"true, its namespace named", ptr.To(true), []string{"other", "ns"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("ok", "img")
			pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: tc.v}
			req, err := translator(func(c *Config) { c.PrivilegeEscalationNamespaces = tc.allowed }).bindRequest(pod)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "securityContext.allowPrivilegeEscalation") ||
					!strings.Contains(err.Error(), "--privilege-escalation-namespaces") || !strings.Contains(err.Error(), "not ns") {
					t.Fatalf("err = %v, want one naming allowPrivilegeEscalation, the namespace and --privilege-escalation-namespaces", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := req.Containers[0].AllowPrivilegeEscalation, tc.v != nil && *tc.v; got != want {
				t.Fatalf("AllowPrivilegeEscalation = %v, want %v", got, want)
			}
		})
	}
}
