package noderuntime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/cgroups/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandman-dev/sandman/runtime"
)

// gVisor. A pod whose RuntimeClass handler is runsc runs under gVisor: its
// system calls go to gVisor's kernel (the Sentry), an unprivileged process
// of the node, rather than to the node's. The sandbox is made exactly as a
// runc one is (same image snapshot, same slot, same daemon as PID 1), and
// containerd's runc shim runs it with runsc as its OCI runtime, as Docker
// runs gVisor: runsc speaks runc's command line. The shim runs a wrapper
// the agent writes (runscWrapper), which adds the node's runsc flags:
//
//   - --network=host: the Sentry's sockets are the slot's network
//     namespace's, so the slot's firewall (runtime/sandboxnet), bandwidth
//     caps and NetworkPolicies hold as for runc; gVisor's own network stack
//     would send raw frames past the namespace's nftables.
//   - --overlay2=none: the sandbox writes to its snapshot's upper directory
//     as a runc sandbox does, so disk limits are measured the same way.
//   - --oci-seccomp: the pod's seccomp profile applies inside the Sentry.
//     gVisor's filter returns EPERM for every errno rule, whatever errno
//     the profile names (withGVisorSeccomp).
//
// gVisor's own shim (containerd-shim-runsc-v1) is not used: it sets its
// OOM score to -999, which needs CAP_SYS_RESOURCE even where containerd
// itself runs without it, and fails to start otherwise.
//
// A gVisor sandbox gets no user namespace of its own (the Sentry is
// already an unprivileged process; root inside it is nobody on the node),
// never takes a hot slot (hot sandboxes run under runc), and a node
// started without --runsc refuses it.

// isGVisor reports whether gVisor runs container c (its label, from the
// metadata loaded with it: no call to containerd).
func (r *Runtime) isGVisor(ctx context.Context, c ctrd.Container) bool {
	info, err := c.Info(ctx, ctrd.WithoutRefreshedMetadata)
	return err == nil && info.Labels[LabelRuntimeHandler] == runtime.RuntimeHandlerRunsc
}

// runscWrapper is the path of the wrapper the shim runs as its runc.
func (r *Runtime) runscWrapper() string { return filepath.Join(r.cfg.StateDir, "runsc", "runsc") }

// writeRunscWrapper writes the wrapper that runs RunscPath with the node's
// flags (nothing when the node has no gVisor). The shim's start of a
// container the agent resumes — a file named after it in restoreDir holds
// its checkpoint's path — becomes a runsc restore of that checkpoint into
// the created container (checkpoint_linux.go); the shim sees a start.
func (r *Runtime) writeRunscWrapper() error {
	if r.cfg.RunscPath == "" {
		return nil
	}
	for _, p := range []string{r.cfg.RunscPath, r.restoreDir()} {
		if strings.ContainsAny(p, "'\n") {
			return fmt.Errorf("runsc path %q: quotes and newlines are not allowed", p)
		}
	}
	runsc := fmt.Sprintf("'%s' --platform=%s --network=host --overlay2=none --oci-seccomp", r.cfg.RunscPath, r.cfg.RunscPlatform)
	script := fmt.Sprintf(`#!/bin/sh
# Written by sandman-node: gVisor for RuntimeClass handler runsc.
# "start ID" of a container being resumed: restore its checkpoint instead.
if [ "$#" -ge 2 ]; then
	eval "sub=\${$(($# - 1))} id=\${$#}"
	marker='%s'/"$id"
	if [ "$sub" = start ] && [ -f "$marker" ]; then
		image=$(cat "$marker")
		n=$(($# - 2))
		i=0
		for a; do
			i=$((i + 1))
			[ "$i" -eq 1 ] && set --
			[ "$i" -le "$n" ] && set -- "$@" "$a"
		done
		exec %s "$@" restore --detach --background --image-path "$image" "$id"
	fi
fi
exec %s "$@"
`, r.restoreDir(), runsc, runsc)
	if err := os.MkdirAll(r.restoreDir(), 0o700); err != nil {
		return err
	}
	path := r.runscWrapper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(script), 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// prepareCpuset makes the namespace's cpuset cgroup (v1) with the root's
// CPUs and memory nodes, as runc does for the parents of a container's
// cgroup: runsc creates missing parents empty, and then cannot write its
// own cgroup's CPUs ("permission denied") when a gVisor pod is the first
// of the namespace.
func (r *Runtime) prepareCpuset() error {
	if r.cfg.RunscPath == "" || cgroups.Mode() == cgroups.Unified {
		return nil
	}
	root := "/sys/fs/cgroup/cpuset"
	if _, err := os.Stat(filepath.Join(root, "cpuset.cpus")); err != nil {
		return nil // no cpuset controller mounted there
	}
	dir := filepath.Join(root, r.cfg.Namespace)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cpuset cgroup %s: %w", dir, err)
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(cur)) != "" {
			continue
		}
		v, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), v, 0); err != nil {
			return fmt.Errorf("cpuset cgroup %s: %s: %w", dir, f, err)
		}
	}
	return nil
}

// checkHandler refuses a pod this node cannot run under its handler.
func (r *Runtime) checkHandler(req runtime.BindRequest) error {
	if req.GVisor() && r.cfg.RunscPath == "" {
		return fmt.Errorf("bind %s: runtime handler %s (gVisor): node %s has no gVisor (sandman-node --runsc): %w",
			req.Pod.UID, runtime.RuntimeHandlerRunsc, r.cfg.Node, errdefs.ErrInvalidArgument)
	}
	return nil
}

// runtimeOpt names the OCI runtime containerd's runc shim runs for a
// sandbox: runsc's wrapper under gVisor, else the configured runc (or the
// shim's own).
func (r *Runtime) runtimeOpt(gvisor bool) ctrd.NewContainerOpts {
	switch {
	case gvisor:
		return ctrd.WithRuntime("io.containerd.runc.v2", &runcoptions.Options{BinaryName: r.runscWrapper()})
	case r.cfg.RuncPath != "":
		return ctrd.WithRuntime("io.containerd.runc.v2", &runcoptions.Options{BinaryName: r.cfg.RuncPath})
	}
	return func(context.Context, *ctrd.Client, *containers.Container) error { return nil }
}

// withGVisorSeccomp adapts the container's seccomp profile to gVisor's
// filter, which answers every errno rule with EPERM (runsc ignores a
// rule's errnoRet). Rules that ask for ENOSYS — the default profile's
// clone3, so that glibc falls back to clone, whose flags the profile can
// check — become trace rules, which gVisor answers with ENOSYS when no
// tracer watches (as Linux does): with EPERM, glibc does not fall back and
// no thread can be started in the sandbox. A tracer inside the sandbox
// could let such a call through, into gVisor's kernel, not the node's.
// Other errnos stay denied, as EPERM.
func withGVisorSeccomp(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil || s.Linux.Seccomp == nil {
		return nil
	}
	for i, sc := range s.Linux.Seccomp.Syscalls {
		if sc.Action == specs.ActErrno && sc.ErrnoRet != nil && *sc.ErrnoRet == uint(syscall.ENOSYS) {
			s.Linux.Seccomp.Syscalls[i].Action, s.Linux.Seccomp.Syscalls[i].ErrnoRet = specs.ActTrace, nil
		}
	}
	return nil
}
