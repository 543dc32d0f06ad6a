package noderuntime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandman-dev/sandman/internal/lifecycle"
)

// A shim group's holder is a container of the group that only waits (the
// daemon's --hold), so the group's runc shim always has a task while the
// group has slots: a bind never meets the shim exiting because the group's
// last sandbox went, and never pays for starting one.
//
// It has no image and no snapshot: its root is an empty read-only directory
// of the agent's (holderRoot) with the daemon bind-mounted in, as sandboxes
// get it. It runs as nobody with no capabilities, no new privileges, the
// default seccomp profile, a network namespace of its own (empty) and small
// pids and memory limits.

// groupAnnotation puts a container on its group's runc shim.
const groupAnnotation = "io.containerd.runc.v2.group"

// A holder's limits: the daemon waiting for a signal needs a few threads
// and a few MiB.
const (
	holderPids   = 16
	holderMemory = 16 << 20
	holderUID    = 65534 // nobody
)

// shimGroup is a runc shim shared by up to Config.ShimGroupSize slots.
type shimGroup struct {
	// slots counts the group's slots, whatever their state.
	slots int
	// holder is the ID of the holder container ("" while none runs).
	holder string
	// starting is closed when the holder start under way ends (nil: none).
	starting chan struct{}
}

// grouped: slots share shims, each group kept alive by its holder.
func (r *Runtime) grouped() bool { return r.cfg.ShimGroupSize > 1 }

// newGroupName names a new shim group. Names are never reused, so a group
// of a previous agent (its sandboxes re-adopted or not) is never joined by
// mistake.
func newGroupName(node string) string {
	return node + "-shim-" + randHex(5)
}

// pickGroup is the group a new slot joins: the fullest one with room (so
// groups fill and emptied ones go, with their holder and shim), by name on
// ties; "" when every group is full.
func pickGroup(groups map[string]*shimGroup, size int) string {
	best := ""
	for name, g := range groups {
		if g.slots >= size {
			continue
		}
		if b := groups[best]; best == "" || g.slots > b.slots || g.slots == b.slots && name < best {
			best = name
		}
	}
	return best
}

// joinGroupLocked is the shim group of a new slot. Grouped, the slot joins
// a group with room or a new one; otherwise the name is fresh (and each bind
// gets another: bindGroupLocked).
func (r *Runtime) joinGroupLocked() string {
	if !r.grouped() {
		return newGroupName(r.cfg.Node)
	}
	name := pickGroup(r.groups, r.cfg.ShimGroupSize)
	if name == "" {
		name = newGroupName(r.cfg.Node)
		r.groups[name] = &shimGroup{}
	}
	r.groups[name].slots++
	return name
}

// rejoinGroupLocked counts a re-adopted slot in the group its sandbox runs
// in (recovery); a sandbox in no known group gets a new slot's group.
func (r *Runtime) rejoinGroupLocked(name string) string {
	if !r.grouped() || name == "" {
		return r.joinGroupLocked()
	}
	g := r.groups[name]
	if g == nil {
		g = &shimGroup{}
		r.groups[name] = g
	}
	g.slots++
	return name
}

// leaveGroup takes a slot that is gone out of its group; the last one out
// removes the group's holder, so its shim exits.
func (r *Runtime) leaveGroup(ctx context.Context, name string) error {
	if !r.grouped() {
		return nil
	}
	r.mu.Lock()
	g := r.groups[name]
	if g == nil {
		r.mu.Unlock()
		return nil
	}
	g.slots--
	if g.slots > 0 {
		r.mu.Unlock()
		return nil
	}
	delete(r.groups, name)
	id := g.holder
	r.mu.Unlock()
	if id == "" {
		return nil // a start under way removes what it made (ensureHolder)
	}
	if err := r.removeHolder(ctx, id); err != nil {
		return fmt.Errorf("shim group %s: %w", name, err)
	}
	return nil
}

// ensureHolder starts the holder of group name unless one runs (or the
// group has no slots left). Concurrent callers wait for one start.
func (r *Runtime) ensureHolder(ctx context.Context, name string) error {
	r.mu.Lock()
	g := r.groups[name]
	for g != nil && g.starting != nil {
		ch := g.starting
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		r.mu.Lock()
		g = r.groups[name]
	}
	if g == nil || g.holder != "" || r.life.Err() != nil {
		// No holder once the runtime closes: Close removes those of groups
		// without slots, and the next agent's recovery starts what groups
		// of bound sandboxes lack.
		r.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.starting = ch
	r.mu.Unlock()
	id, err := r.startHolder(ctx, name)
	r.mu.Lock()
	g.starting = nil
	close(ch)
	gone := r.groups[name] != g
	if err == nil && !gone {
		g.holder = id
	}
	r.mu.Unlock()
	if err == nil && gone {
		// The group's last slot went while its holder started.
		return r.removeHolder(context.WithoutCancel(ctx), id)
	}
	return err
}

// startHolder creates and starts a holder in group and watches it.
func (r *Runtime) startHolder(ctx context.Context, group string) (id string, retErr error) {
	id = "holder-" + randHex(5)
	container, err := r.client.NewContainer(ctx, id,
		ctrd.WithNewSpec(r.holderSpec(group)...),
		r.runtimeOpt(false),
		ctrd.WithContainerLabels(map[string]string{LabelNode: r.cfg.Node, LabelHolder: "true", LabelShimGroup: group}))
	if err != nil {
		return "", fmt.Errorf("shim group %s: create holder: %w", group, err)
	}
	defer func() {
		if retErr != nil {
			if err := r.removeHolder(context.WithoutCancel(ctx), id); err != nil {
				retErr = errors.Join(retErr, err)
			}
		}
	}()
	task, err := r.newTask(ctx, container)
	if err != nil {
		return "", fmt.Errorf("shim group %s: holder task: %w", group, err)
	}
	exit, err := task.Wait(r.life)
	if err != nil {
		return "", fmt.Errorf("shim group %s: holder task: %w", group, err)
	}
	if err := task.Start(ctx); err != nil {
		return "", fmt.Errorf("shim group %s: start holder: %w", group, err)
	}
	r.owned.Go(func() { r.watchHolder(group, id, exit) })
	return id, nil
}

// watchHolder starts another holder when a group's holder exits while the
// group has slots (killed, OOM). A wait broken by containerd going away is
// not an exit: it is re-established. Once the runtime closes, the next
// agent's recovery checks the holder.
func (r *Runtime) watchHolder(group, id string, exit <-chan ctrd.ExitStatus) {
	code := uint32(255)
	for {
		st, ok := <-exit
		if !ok || r.life.Err() != nil {
			return
		}
		if st.Error() == nil {
			code = st.ExitCode()
			break
		}
		if exit = r.rewaitHolder(group, id); exit == nil {
			break // gone with its task
		}
	}
	r.mu.Lock()
	g := r.groups[group]
	mine := g != nil && g.holder == id
	if mine {
		g.holder = ""
	}
	r.mu.Unlock()
	if !mine || r.life.Err() != nil {
		return // removed on purpose
	}
	r.log.Warn("shim group holder exited; starting another", "group", group, "holder", id, "code", code)
	if err := r.removeHolder(r.life, id); err != nil {
		r.log.Error("remove an exited holder", "group", group, "holder", id, "err", err)
	}
	if err := r.ensureHolder(r.life, group); err != nil && r.life.Err() == nil {
		r.log.Error("start a shim group holder (the group's next bind tries again)", "group", group, "err", err)
	}
}

// rewaitHolder waits on holder id's task again after its wait broke
// (containerd restarting), with backoff; nil when the holder or its task is
// gone, or no longer its group's (or the runtime closed: watchHolder checks).
func (r *Runtime) rewaitHolder(group, id string) <-chan ctrd.ExitStatus {
	ctx := r.life
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		r.mu.Lock()
		g := r.groups[group]
		held := g != nil && g.holder == id
		r.mu.Unlock()
		if !held || !lifecycle.Sleep(ctx, r.cfg.Clock, backoff) {
			return nil
		}
		container, err := r.client.LoadContainer(ctx, id)
		if errdefs.IsNotFound(err) {
			return nil
		}
		var task ctrd.Task
		if err == nil {
			if task, err = container.Task(ctx, nil); errdefs.IsNotFound(err) {
				return nil
			}
		}
		if err == nil {
			var exit <-chan ctrd.ExitStatus
			if exit, err = task.Wait(ctx); err == nil {
				return exit
			}
		}
		r.log.Debug("holder exit watch: containerd not back yet", "holder", id, "err", err)
	}
}

// removeHolder kills and deletes holder id. Unlike removeContainer it never
// kills a shim by the container's ID: a holder's shim serves its group.
func (r *Runtime) removeHolder(ctx context.Context, id string) error {
	container, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("holder %s: %w", id, err)
	}
	if task, err := container.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, ctrd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete holder task %s: %w", id, err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("task of holder %s: %w", id, err)
	}
	if err := container.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete holder %s: %w", id, err)
	}
	return nil
}

// holderRoot is the holders' root filesystem: empty but for the mount
// points, read-only.
func (r *Runtime) holderRoot() string { return filepath.Join(r.cfg.StateDir, "holder-root") }

// makeHolderRoot makes holderRoot (again: it is shared and never changes).
func (r *Runtime) makeHolderRoot() error {
	root := r.holderRoot()
	for _, d := range []string{"proc", "dev", ".sandman"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o555); err != nil {
			return fmt.Errorf("holder root: %w", err)
		}
	}
	f, err := os.OpenFile(filepath.Join(root, DaemonMountPath), os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("holder root: %w", err)
	}
	f.Close()
	for _, d := range []string{"proc", "dev", ".sandman", ""} {
		if err := os.Chmod(filepath.Join(root, d), 0o555); err != nil {
			return fmt.Errorf("holder root: %w", err)
		}
	}
	return nil
}

// holderSpec is the spec of a holder of group.
func (r *Runtime) holderSpec(group string) []oci.SpecOpts {
	return []oci.SpecOpts{
		oci.WithRootFSPath(r.holderRoot()),
		oci.WithRootFSReadonly(),
		oci.WithProcessArgs(DaemonMountPath, "--hold"),
		oci.WithProcessCwd("/"),
		oci.WithEnv([]string{"GOMAXPROCS=1"}),
		oci.WithHostname("holder"),
		oci.WithUIDGID(holderUID, holderUID),
		oci.WithCapabilities(nil),
		oci.WithNoNewPrivileges,
		seccomp.WithDefaultProfile(),
		withHolderMounts(r.cfg.DaemonPath),
		oci.WithPidsLimit(holderPids),
		oci.WithMemoryLimit(holderMemory),
		oci.WithMemorySwap(holderMemory),
		oci.WithCPUShares(2),
		oci.WithAnnotations(map[string]string{groupAnnotation: group}),
	}
}

// withHolderMounts replaces the default mounts with /proc, a /dev and the
// daemon: no sysfs, cgroups or shared memory.
func withHolderMounts(daemonPath string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Mounts = []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "strictatime", "mode=755", "size=64k"}},
			{Destination: DaemonMountPath, Type: "bind", Source: daemonPath, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		}
		return nil
	}
}

// removeHolders removes this node's holder containers but those of keep.
func (r *Runtime) removeHolders(ctx context.Context, keep map[string]bool) error {
	cs, err := r.client.Containers(ctx, fmt.Sprintf(`labels."%s"==%s,labels."%s"==true`, LabelNode, r.cfg.Node, LabelHolder))
	if err != nil {
		return fmt.Errorf("list holders: %w", err)
	}
	var errs []error
	for _, c := range cs {
		if !keep[c.ID()] {
			errs = append(errs, r.removeHolder(ctx, c.ID()))
		}
	}
	return errors.Join(errs...)
}
