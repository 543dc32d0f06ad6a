package noderuntime

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/runtime"
)

// User namespaces. A sandbox in one sees ids 0-65535; on the node they are
// the range of its slot, UserNamespaceBase+n*65536 onwards, so root in a
// sandbox is an unprivileged uid of the node and no two running sandboxes
// share an id. A slot takes the lowest free range the first time it runs a
// sandbox in a user namespace and keeps it while it lives; pods that follow
// in the slot reuse it, never at the same time. The image's files are not
// copied: the overlay snapshot is mounted idmapped (the snapshotter's
// uidmapping/gidmapping labels), so they appear owned by the sandbox's
// ids, and what the sandbox writes lands in the upper directory owned by
// its host ids. The daemon's bind mount (root's, 0755 on the node) shows
// up as owned by nobody and stays executable.

// capaRemapIDs is the snapshotter capability of idmapped mounts.
const capaRemapIDs = "remap-ids"

// userNS says whether the pod's sandbox runs in a user namespace: its
// hostUsers if it says, the node's default if not. A pod asking for the
// node's users where user namespaces are required is InvalidArgument.
func (r *Runtime) userNS(req runtime.BindRequest) (bool, error) {
	switch {
	case req.HostUsers == nil:
		return r.cfg.UserNamespaces != UserNamespacesOff, nil
	case !*req.HostUsers:
		return true, nil
	case r.cfg.UserNamespaces == UserNamespacesRequired:
		return false, fmt.Errorf("bind %s: hostUsers: true: this node runs every sandbox in a user namespace (--user-namespaces=required): remove hostUsers or set it to false: %w",
			req.Pod.UID, errdefs.ErrInvalidArgument)
	}
	return false, nil
}

// idBaseLocked is the first host id of s's range, taken now if s has none.
func (r *Runtime) idBaseLocked(s *slot) (uint32, error) {
	if s.idBase != 0 {
		return s.idBase, nil
	}
	used := map[uint32]bool{}
	for _, o := range r.slots {
		used[o.idBase] = true
	}
	for n := uint64(0); ; n++ {
		base := uint64(r.cfg.UserNamespaceBase) + n*idsPerSandbox
		if base+idsPerSandbox > 1<<32-1 {
			// setDefaults leaves room for Slots ranges: only slots a
			// restarted agent re-adopted beyond a lowered --slots get here.
			return 0, fmt.Errorf("no free user namespace range of %d ids from %d below 2^32: %w",
				idsPerSandbox, r.cfg.UserNamespaceBase, errdefs.ErrResourceExhausted)
		}
		if !used[uint32(base)] {
			s.idBase = uint32(base)
			return s.idBase, nil
		}
	}
}

// idMaps are a sandbox's uid and gid mappings from host base.
func idMaps(base uint32) []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: idsPerSandbox}}
}

// userNSOpts are the container options of a sandbox in a user namespace
// from host id base: the idmapped snapshot (given to WithNewSnapshot) and
// the spec's namespace and mappings, with a check that the process's ids
// are mapped (added after the user is resolved).
func userNSOpts(base uint32, name string) ([]snapshots.Opt, []oci.SpecOpts) {
	m := idMaps(base)
	return []snapshots.Opt{ctrd.WithUserNSRemapperLabels(m, m)},
		[]oci.SpecOpts{oci.WithUserNamespace(m, m), withinIDMap(name)}
}

// withinIDMap refuses a process whose uid or gids its user namespace does
// not map (they would be nobody, and runc refuses them).
func withinIDMap(name string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			return nil
		}
		u := s.Process.User
		for _, id := range append([]uint32{u.UID, u.GID}, u.AdditionalGids...) {
			if id >= idsPerSandbox {
				return fmt.Errorf("container %q runs as uid %d, gid %d, groups %v: a sandbox's user namespace maps ids 0-%d only: use lower ids or hostUsers: true: %w",
					name, u.UID, u.GID, u.AdditionalGids, idsPerSandbox-1, errdefs.ErrInvalidArgument)
			}
		}
		return nil
	}
}

// checkUserNamespaces tells, at start, why sandboxes could not run in user
// namespaces: a snapshotter that cannot idmap its mounts, or a runc older
// than 1.2.
func (r *Runtime) checkUserNamespaces(ctx context.Context) error {
	capa, err := r.client.GetSnapshotterCapabilities(ctx, r.cfg.Snapshotter)
	if err != nil {
		return fmt.Errorf("user namespaces: snapshotter %s: %w", r.cfg.Snapshotter, err)
	}
	if !slices.Contains(capa, capaRemapIDs) {
		return fmt.Errorf("user namespaces: snapshotter %s cannot idmap its mounts (overlayfs needs Linux >= 5.19 and containerd >= 2.0): upgrade the node or set --user-namespaces=off", r.cfg.Snapshotter)
	}
	runc := r.cfg.RuncPath
	if runc == "" {
		runc = "runc" // the shim's, if the agent's PATH is the node's
	} else if major, minor, ok := runcModuleVersion(runc); ok {
		// A runc built from its Go module says its version without being
		// run (the agent's image may lack the libraries it links).
		if major < 1 || major == 1 && minor < 2 {
			return fmt.Errorf("user namespaces: %s is runc %d.%d: they need runc >= 1.2: give a newer one with --runc, or set --user-namespaces=off", runc, major, minor)
		}
		return nil
	}
	out, err := exec.CommandContext(ctx, runc, "--version").Output()
	if err != nil {
		if r.cfg.RuncPath == "" {
			r.log.Warn("user namespaces: cannot tell the version of containerd's runc; they need runc >= 1.2 (give --runc)", "err", err)
			return nil
		}
		return fmt.Errorf("user namespaces: %s --version: %w", runc, err)
	}
	major, minor, ok := runcVersion(string(out))
	if !ok || major < 1 || major == 1 && minor < 2 {
		return fmt.Errorf("user namespaces: %s is %q: they need runc >= 1.2: give a newer one with --runc, or set --user-namespaces=off",
			runc, strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
	}
	return nil
}

// runcModuleVersion reads major and minor from the Go build information of
// a runc built from its module (go install …/runc@vX.Y.Z).
func runcModuleVersion(path string) (major, minor int, ok bool) {
	info, err := buildinfo.ReadFile(path)
	if err != nil || info.Main.Path != "github.com/opencontainers/runc" {
		return 0, 0, false
	}
	v, found := strings.CutPrefix(info.Main.Version, "v")
	if !found {
		return 0, 0, false // (devel)
	}
	return runcVersion("runc version " + v)
}

// runcVersion reads major and minor from `runc --version`.
func runcVersion(out string) (major, minor int, ok bool) {
	line, _, _ := strings.Cut(out, "\n")
	v, found := strings.CutPrefix(strings.TrimSpace(line), "runc version ")
	if !found {
		return 0, 0, false
	}
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimLeftFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return major, minor, err1 == nil && err2 == nil
}

// slotSysfs is where a slot's own sysfs is mounted: sysfs can only be
// mounted by a user namespace that owns the network namespace (its
// /sys/class/net is that namespace's), and a slot's namespace is the
// node's, made before the sandbox. The agent mounts one from inside the
// slot's namespace, read-only, and a sandbox in a user namespace gets it
// bound at /sys: the same view a sandbox without one has.
func slotSysfs(dir string) string { return filepath.Join(dir, "sys") }

// mountSlotSysfs mounts the slot's sysfs unless it is mounted.
func mountSlotSysfs(dir, nsPath string) error {
	target := slotSysfs(dir)
	var st unix.Statfs_t
	if unix.Statfs(target, &st) == nil && st.Type == unix.SYSFS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	err := inNetNS(nsPath, func() error {
		return unix.Mount("sysfs", target, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	})
	if err != nil {
		return fmt.Errorf("mount the slot's sysfs at %s: %w", target, err)
	}
	return nil
}

// unmountSlotSysfs removes the slot's sysfs mount, if any.
func unmountSlotSysfs(dir string) error {
	err := unix.Unmount(slotSysfs(dir), unix.MNT_DETACH)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount the slot's sysfs: %w", err)
}

// withSysfs puts the slot's sysfs at /sys in place of a new sysfs mount.
func withSysfs(dir string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		for i, m := range s.Mounts {
			if m.Destination == "/sys" {
				s.Mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: slotSysfs(dir),
					Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
			}
		}
		return nil
	}
}

// allowLowPorts lets any process of the slot's network namespace bind
// ports below 1024. The namespace belongs to the node's user namespace, so
// root of a sandbox in a user namespace of its own lacks
// CAP_NET_BIND_SERVICE there; the ports are the sandbox's own either way.
func allowLowPorts(nsPath string) error {
	err := inNetNS(nsPath, func() error {
		// /proc/sys/net is the namespace of the thread that opens it.
		return os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0)
	})
	if err != nil {
		return fmt.Errorf("allow ports below 1024 in %s: %w", nsPath, err)
	}
	return nil
}

// inNetNS runs f on an OS thread in the network namespace at nsPath; the
// thread is thrown away after.
func inNetNS(nsPath string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := os.Open(nsPath)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}
