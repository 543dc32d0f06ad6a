package containerd

import (
	"context"
	"fmt"
	"strconv"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/runtime"
)

// nullIO: the daemon keeps the main process's output for logs; nothing is
// written on the host, so a chatty sandbox cannot fill the node's disk.
var nullIO = cio.NullIO

// droppedCapabilities are removed from containerd's default set: sandboxes
// need neither raw sockets nor device nodes nor audit writes nor file caps.
var droppedCapabilities = []string{"CAP_NET_RAW", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}

// specOpts builds container i of the pod: the unmodified image with the
// daemon bind-mounted read-only as PID 1, in the slot's network namespace.
// The daemon starts unassigned, waiting for the holder of the assign token
// (the agent) to hand it the pod's tokens: nothing secret is on its command
// line. A hot sandbox (hot) also waits for the pod's env and command.
func (r *Runtime) specOpts(s *slot, req runtime.BindRequest, i int, img ctrd.Image, assignHash string, hot bool) ([]oci.SpecOpts, error) {
	c := req.Containers[i]
	r.mu.Lock()
	group := s.group
	if i == 0 {
		group = r.bindGroupLocked(s)
	}
	r.mu.Unlock()
	// Containers share the network namespace: each daemon has its own port.
	args := []string{DaemonMountPath, "--listen", ":" + strconv.Itoa(api.Port+i), "--assign-token-sha256", assignHash}
	main, err := mainCommand(context.Background(), c, img)
	if err != nil {
		return nil, err
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
		}}),
		oci.WithNoNewPrivileges,
		oci.WithDroppedCapabilities(droppedCapabilities),
		seccomp.WithDefaultProfile(),
		oci.WithPidsLimit(r.cfg.PidsLimit),
		// Slots share shims in groups (Config.ShimGroupSize); a pod's
		// containers always share their slot's.
		oci.WithAnnotations(map[string]string{"io.containerd.runc.v2.group": group}),
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
		return nil, err
	}
	opts = append(opts, oci.WithCPUs(formatCPUList(cpus)))
	return opts, nil
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
