package noderuntime

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/runtime"
)

// lazyLower is a layer of a bound container that the lazy-pulling
// snapshotter serves over FUSE: its mount point and the device of the FUSE
// mount the container's overlay was made over.
type lazyLower struct {
	dir string
	dev uint64
}

// watchLazyLayers stops the sandboxes whose lazily pulled layers are gone.
// A container's overlay holds the FUSE mounts of stargz-snapshotter that
// were there when it started: when the snapshotter dies they fail every
// read (ENOTCONN), and a restarted one mounts new ones the container never
// sees. Each DiskCheckInterval the FUSE mounts under every bound container
// are checked (statfs, which always reaches the daemon) against the ones
// recorded when it was made; a sandbox whose mount is dead or replaced is
// stopped with an Evicted exit that says why, rather than left failing
// reads of its own files. A snapshotter that hangs holds up this loop only.
func (r *Runtime) watchLazyLayers(ctx context.Context) {
	t := r.cfg.Clock.NewTicker(r.cfg.DiskCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		type check struct {
			s      *slot
			id     string
			lowers []lazyLower
			known  bool
		}
		var checks []check
		r.mu.Lock()
		for _, s := range r.slots {
			if s.State != runtime.StateBound || s.evicted != "" {
				continue
			}
			for _, id := range s.containers {
				l, ok := s.lazyLowers[id]
				checks = append(checks, check{s, id, l, ok})
			}
		}
		r.mu.Unlock()
		for _, c := range checks {
			if !c.known {
				r.recordLazyLowers(ctx, c.s, c.id) // bound before the snapshotter answered
				continue
			}
			dead := ""
			for _, l := range c.lowers {
				// statfs always asks the FUSE daemon (stat may be answered
				// from the kernel's attribute cache, an hour long).
				var fs unix.Statfs_t
				var st unix.Stat_t
				err := unix.Statfs(l.dir, &fs)
				if err == nil {
					err = unix.Stat(l.dir, &st)
				}
				if err != nil {
					dead = fmt.Sprintf("its image layer mounted lazily at %s cannot be read (%v)", l.dir, err)
					break
				}
				if st.Dev != l.dev {
					dead = fmt.Sprintf("its image layer mounted lazily at %s was mounted anew", l.dir)
					break
				}
			}
			if dead == "" {
				continue
			}
			msg := "the node's lazy-pulling snapshotter (" + r.cfg.Snapshotter + ") stopped or restarted under the sandbox: " + dead +
				"; its image's files that were not fetched yet cannot be read any more. Start a new sandbox"
			r.log.Warn("stopping a sandbox whose lazily pulled layers are gone", "slot", c.s.ID, "container", c.id, "why", dead)
			r.evictBound(ctx, c.s, msg)
		}
	}
}

// recordLazyLowers records the lazily pulled layers of container id of
// bound sandbox s, as they are mounted now (nothing when the snapshotter
// does not answer: the next check tries again).
func (r *Runtime) recordLazyLowers(ctx context.Context, s *slot, id string) {
	mounts, err := r.client.SnapshotService(r.cfg.Snapshotter).Mounts(ctx, id)
	if err != nil {
		return
	}
	lowers := fuseLowers(mounts)
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.State != runtime.StateBound && s.State != runtime.StateBinding || !slices.Contains(s.containers, id) {
		return
	}
	if s.lazyLowers == nil {
		s.lazyLowers = map[string][]lazyLower{}
	}
	s.lazyLowers[id] = lowers
}

// fuseLowers are the lower directories of an overlay mount that are FUSE
// mounts (a lazily pulled layer), with their devices.
func fuseLowers(mounts []mount.Mount) []lazyLower {
	var out []lazyLower
	for _, m := range mounts {
		if m.Type != "overlay" {
			continue
		}
		for _, o := range m.Options {
			lowers, ok := strings.CutPrefix(o, "lowerdir=")
			if !ok {
				continue
			}
			for _, dir := range strings.Split(lowers, ":") {
				var fs unix.Statfs_t
				var st unix.Stat_t
				if unix.Statfs(dir, &fs) != nil || fs.Type != unix.FUSE_SUPER_MAGIC || unix.Stat(dir, &st) != nil {
					continue
				}
				out = append(out, lazyLower{dir: dir, dev: st.Dev})
			}
		}
	}
	return out
}

// evictBound stops bound sandbox s with an Evicted exit that says msg; it
// does nothing when s is not bound or is being stopped already.
func (r *Runtime) evictBound(ctx context.Context, s *slot, msg string) {
	r.mu.Lock()
	if s.State != runtime.StateBound || s.evicted != "" {
		r.mu.Unlock()
		return
	}
	s.evicted = msg
	ids := append([]string(nil), s.containers...)
	r.mu.Unlock()
	r.metrics.failures.WithLabelValues(runtime.ReasonEvicted).Inc()
	for _, id := range ids {
		if container, err := r.client.LoadContainer(ctx, id); err == nil {
			if task, err := container.Task(ctx, nil); err == nil {
				_ = task.Kill(ctx, syscall.SIGKILL, ctrd.WithKillAll)
			}
		}
	}
}
