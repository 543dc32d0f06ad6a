package noderuntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/runtime"
)

// nullIO: the daemon keeps the main process's output for logs; nothing is
// written on the host, so a chatty sandbox cannot fill the node's disk.
var nullIO = cio.NullIO

// daemonStateBytes bounds the daemon's tmpfs (session command files).
const daemonStateBytes = 16 << 20

// sandboxSpec is how container i of a pod is made: its spec, the options
// of its snapshot, the first host id of its user namespace (0: none) and
// whether gVisor runs it.
type sandboxSpec struct {
	spec     []oci.SpecOpts
	snapshot []snapshots.Opt
	idBase   uint32
	gvisor   bool
}

// containerOpts are the options that make a sandbox's container from sp:
// the image, its (idmapped) snapshot, the spec and the runc to run it.
func (r *Runtime) containerOpts(id string, img ctrd.Image, sp sandboxSpec, labels map[string]string) []ctrd.NewContainerOpts {
	if sp.idBase != 0 {
		labels[LabelUserNS] = strconv.FormatUint(uint64(sp.idBase), 10)
	}
	if sp.gvisor {
		labels[LabelRuntimeHandler] = runtime.RuntimeHandlerRunsc
	}
	return []ctrd.NewContainerOpts{
		ctrd.WithImage(img),
		ctrd.WithSnapshotter(r.cfg.Snapshotter),
		ctrd.WithNewSnapshot(id, img, sp.snapshot...),
		ctrd.WithNewSpec(sp.spec...),
		r.runtimeOpt(sp.gvisor),
		ctrd.WithContainerLabels(labels),
	}
}

// specOpts builds container i of the pod: the unmodified image with the
// daemon bind-mounted read-only as PID 1, in the slot's network namespace
// (and in a user namespace with the slot's ids, if the pod runs in one).
// The daemon starts unassigned, waiting for the holder of the assign token
// (the agent) to hand it the pod's tokens: nothing secret is on its command
// line. A hot sandbox (hot) also waits for the pod's env and command.
func (r *Runtime) specOpts(s *slot, req runtime.BindRequest, i int, img ctrd.Image, assignHash string, hot bool) (sandboxSpec, error) {
	c := req.Containers[i]
	userNS, err := r.userNS(req)
	if err != nil {
		return sandboxSpec{}, err
	}
	// gVisor's Sentry is an unprivileged process already: no user
	// namespace of the slot's (see gvisor_linux.go).
	userNS = userNS && !req.GVisor()
	sp := sandboxSpec{gvisor: req.GVisor()}
	r.mu.Lock()
	group := s.group
	if i == 0 {
		group = r.bindGroupLocked(s)
	}
	if userNS {
		sp.idBase, err = r.idBaseLocked(s)
	}
	r.mu.Unlock()
	if err != nil {
		return sandboxSpec{}, err
	}
	// Containers share the network namespace: each daemon has its own port.
	args := []string{DaemonMountPath, "--listen", ":" + strconv.Itoa(api.Port+i), "--state-dir", DaemonStateDir, "--assign-token-sha256", assignHash}
	main, err := mainCommand(context.Background(), c, img)
	if err != nil {
		return sandboxSpec{}, err
	}
	if len(main) > 0 {
		if p := req.RestartPolicy; p != "" && p != "Never" {
			args = append(args, "--restart-policy", p)
		}
		args = append(append(args, "--"), main...)
	}
	hostname := req.Hostname
	if hostname == "" {
		hostname = req.Pod.Name
	}
	if len(hostname) > 63 {
		hostname = hostname[:63]
	}
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs(args...),
		oci.WithHostname(hostname),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: s.netns.GetPath()}),
		oci.WithMounts([]specs.Mount{{
			Destination: DaemonMountPath, Type: "bind", Source: r.cfg.DaemonPath,
			Options: []string{"rbind", "ro", "nosuid", "nodev"},
		}, {
			Destination: DaemonStateDir, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "noexec", "mode=1777", "size=" + strconv.Itoa(daemonStateBytes)},
		}}),
		// Slots share shims in groups (Config.ShimGroupSize); a pod's
		// containers always share their slot's.
		oci.WithAnnotations(map[string]string{"io.containerd.runc.v2.group": group}),
	}
	// containerd's default spec sets no_new_privs; both ways are said
	// here so the choice is the pod's (as the pool allowed it) alone.
	if c.AllowPrivilegeEscalation {
		opts = append(opts, oci.WithNewPrivileges)
	} else {
		opts = append(opts, oci.WithNoNewPrivileges)
	}
	if len(c.Env) > 0 {
		opts = append(opts, oci.WithEnv(c.Env))
	}
	if c.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(c.WorkingDir))
	}
	if c.User != "" {
		opts = append(opts, oci.WithUser(c.User))
	}
	sec, err := securityOpts(c, r.cfg.PidsLimit, r.cfg.SeccompProfileRoot)
	if err != nil {
		return sandboxSpec{}, err
	}
	opts = append(opts, sec...)
	if sp.gvisor {
		opts = append(opts, withGVisorSeccomp)
	}
	if sp.idBase != 0 {
		if err := mountSlotSysfs(s.dir, s.netns.GetPath()); err != nil {
			return sandboxSpec{}, err
		}
		var ns []oci.SpecOpts
		sp.snapshot, ns = userNSOpts(sp.idBase, c.Name)
		ns = append(ns, withSysfs(s.dir))
		opts = append(opts, ns...) // after the user and groups: it checks they are mapped
	}
	if m := c.Limits.MemoryBytes; m > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(m)), oci.WithMemorySwap(m))
	}
	if cpu := c.Limits.MilliCPU; cpu > 0 {
		opts = append(opts, oci.WithCPUCFS(cpu*100, 100000))
	}
	if cpu := c.Requests.MilliCPU; cpu > 0 {
		opts = append(opts, oci.WithCPUShares(uint64(max(2, cpu*1024/1000))))
	}
	// Exclusive cores for this container, or the shared pool.
	id := s.ID + "-" + c.Name
	if hot {
		id = s.ID + "-hot"
	}
	r.mu.Lock()
	var cpus []int
	if c.ExclusiveCPUs > 0 {
		cpus, err = r.cpus.allocateLocked(id, c.ExclusiveCPUs)
	} else {
		cpus = r.cpus.sharedLocked()
	}
	r.mu.Unlock()
	if err != nil {
		return sandboxSpec{}, err
	}
	sp.spec = append(opts, oci.WithCPUs(formatCPUList(cpus)))
	return sp, nil
}

// mainCommand follows Kubernetes: Command replaces the image's entrypoint,
// Args its cmd; Args alone run after the image's entrypoint. With neither,
// there is no main process: the sandbox idles until released (a sandbox
// image's default command, often an interactive shell, would exit at once).
func mainCommand(ctx context.Context, c runtime.ContainerSpec, img ctrd.Image) ([]string, error) {
	switch {
	case len(c.Command) > 0:
		return append(append([]string{}, c.Command...), c.Args...), nil
	case len(c.Args) > 0:
		spec, err := img.Spec(ctx)
		if err != nil {
			return nil, fmt.Errorf("read config of %s: %w", img.Name(), err)
		}
		if len(spec.Config.Entrypoint) == 0 {
			return append([]string{}, c.Args...), nil
		}
		return append(append([]string{}, spec.Config.Entrypoint...), c.Args...), nil
	}
	return nil, nil
}

// securityOpts narrow what container c may do, after its user is set: its
// group and supplemental groups, capabilities (SandboxCapabilities minus
// the dropped ones), seccomp profile (which depends on the capabilities),
// pids limit (the lower of the node's and the pod's), a read-only root,
// and last the runAsNonRoot check against the user resolved from the image.
func securityOpts(c runtime.ContainerSpec, nodePids int64, seccompRoot string) ([]oci.SpecOpts, error) {
	var opts []oci.SpecOpts
	if c.Group != nil {
		opts = append(opts, withGroup(uint32(*c.Group)))
	}
	if len(c.SupplementalGroups) > 0 {
		opts = append(opts, withSupplementalGroups(c.SupplementalGroups))
	}
	caps := slices.Clone(runtime.SandboxCapabilities)
	for _, d := range c.DropCapabilities {
		if d == "ALL" {
			caps = nil
			break
		}
		caps = slices.DeleteFunc(caps, func(c string) bool { return c == d })
	}
	opts = append(opts, oci.WithCapabilities(caps))
	if c.SeccompLocalhost == "" {
		opts = append(opts, seccomp.WithDefaultProfile())
	} else {
		profile, err := loadSeccompProfile(seccompRoot, c.SeccompLocalhost)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", c.Name, err)
		}
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			if s.Linux == nil {
				s.Linux = &specs.Linux{}
			}
			s.Linux.Seccomp = profile
			return nil
		})
	}
	pids := nodePids
	if c.PidsLimit > 0 && (pids <= 0 || c.PidsLimit < pids) {
		pids = c.PidsLimit
	}
	if pids > 0 {
		opts = append(opts, oci.WithPidsLimit(pids))
	}
	if c.ReadOnlyRootFS {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if c.RunAsNonRoot {
		opts = append(opts, withNonRoot(c.Name))
	}
	return opts, nil
}

// withGroup makes gid the primary group of the user already set (the
// image's: a pod's runAsGroup without runAsUser), in place of the user's
// own primary group, as if the user were given as user:gid.
func withGroup(gid uint32) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		old := s.Process.User.GID
		s.Process.User.AdditionalGids = slices.DeleteFunc(s.Process.User.AdditionalGids, func(g uint32) bool { return g == old })
		s.Process.User.GID = gid
		if !slices.Contains(s.Process.User.AdditionalGids, gid) {
			s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, gid)
		}
		return nil
	}
}

// withSupplementalGroups adds gids to the process's groups.
func withSupplementalGroups(gids []int64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		for _, g := range gids {
			if !slices.Contains(s.Process.User.AdditionalGids, uint32(g)) {
				s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, uint32(g))
			}
		}
		return nil
	}
}

// withNonRoot refuses a spec whose user, as resolved from the pod and the
// image's /etc/passwd, is root.
func withNonRoot(name string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil || s.Process.User.UID == 0 {
			return fmt.Errorf("container %q has runAsNonRoot but its image runs as root (uid 0): set runAsUser to a non-zero uid or use an image whose USER is not root: %w",
				name, errdefs.ErrInvalidArgument)
		}
		return nil
	}
}

// loadSeccompProfile reads an OCI seccomp profile (JSON, as the kubelet's
// Localhost profiles) at rel under root; a path that leaves root, a missing
// file or an unreadable profile is InvalidArgument with what to do.
func loadSeccompProfile(root, rel string) (*specs.LinuxSeccomp, error) {
	fail := func(why string, err error) error {
		return fmt.Errorf("seccomp profile %q under %s %s (%v): put the profile on every worker of the pool or use seccompProfile RuntimeDefault: %w",
			rel, root, why, err, errdefs.ErrInvalidArgument)
	}
	if root == "" {
		return nil, fail("cannot be read", errors.New("the node has no seccomp profile directory"))
	}
	dir, err := os.OpenRoot(root)
	if err != nil {
		return nil, fail("cannot be read", err)
	}
	defer dir.Close()
	b, err := dir.ReadFile(rel)
	if err != nil {
		return nil, fail("cannot be read", err)
	}
	var p specs.LinuxSeccomp
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fail("is not an OCI seccomp profile", err)
	}
	if p.DefaultAction == "" {
		return nil, fail("is not an OCI seccomp profile", errors.New("no defaultAction"))
	}
	return &p, nil
}
