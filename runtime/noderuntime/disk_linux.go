package noderuntime

import (
	"context"
	"fmt"

	"github.com/sandman-dev/sandman/runtime"
)

// setDiskLimitLocked records container id's disk cap (0: the default).
func (r *Runtime) setDiskLimitLocked(s *slot, id string, limit int64) {
	if limit <= 0 {
		limit = r.cfg.DiskBytes
	}
	if s.diskLimits == nil {
		s.diskLimits = map[string]int64{}
	}
	s.diskLimits[id] = limit
}

// watchDisk measures the writable layer of every bound container each
// DiskCheckInterval and stops a sandbox whose container writes more than
// its limit, or makes more than DiskInodes files; only that sandbox goes,
// with an Evicted exit event.
func (r *Runtime) watchDisk(ctx context.Context) {
	t := r.cfg.Clock.NewTicker(r.cfg.DiskCheckInterval)
	defer t.Stop()
	snaps := r.client.SnapshotService(r.cfg.Snapshotter)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		type check struct {
			s     *slot
			id    string
			limit int64
		}
		var checks []check
		r.mu.Lock()
		for _, s := range r.slots {
			if s.State != runtime.StateBound || s.evicted != "" {
				continue
			}
			for id, limit := range s.diskLimits {
				checks = append(checks, check{s, id, limit})
			}
		}
		r.mu.Unlock()
		for _, c := range checks {
			u, err := snaps.Usage(ctx, c.id)
			if err != nil {
				continue
			}
			r.mu.Lock()
			if _, ok := c.s.diskLimits[c.id]; ok && c.s.State == runtime.StateBound {
				if c.s.diskUsed == nil {
					c.s.diskUsed = map[string]int64{}
				}
				c.s.diskUsed[c.id] = u.Size
			}
			r.mu.Unlock()
			if u.Size <= c.limit && u.Inodes <= r.cfg.DiskInodes {
				continue
			}
			msg := fmt.Sprintf("container wrote %d bytes to its filesystem, over its limit of %d bytes", u.Size, c.limit)
			if u.Size <= c.limit {
				msg = fmt.Sprintf("container made %d files and directories in its filesystem, over its limit of %d", u.Inodes, r.cfg.DiskInodes)
			}
			r.log.Warn("stopping a sandbox over its disk limit", "slot", c.s.ID, "container", c.id, "bytes", u.Size, "limit", c.limit, "inodes", u.Inodes, "inode_limit", r.cfg.DiskInodes)
			r.evictBound(ctx, c.s, msg)
		}
	}
}
