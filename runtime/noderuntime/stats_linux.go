package noderuntime

import (
	"context"
	"fmt"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/sandman-dev/sandman/runtime"
)

// Stats implements runtime.Runtime from the containers' cgroup metrics.
func (r *Runtime) Stats(ctx context.Context, uid string) (runtime.Stats, error) {
	ctx = r.nsCtx(ctx)
	r.mu.Lock()
	s, ok := r.byPod[uid]
	if !ok || s.State != runtime.StateBound {
		r.mu.Unlock()
		return runtime.Stats{}, fmt.Errorf("stats %s: no bound pod on %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	}
	out := runtime.Stats{Pod: *s.Pod, Time: r.cfg.Clock.Now()}
	for id, limit := range s.diskLimits {
		out.DiskLimitBytes += uint64(max(limit, 0))
		out.DiskBytes += uint64(max(s.diskUsed[id], 0))
	}
	ids := append([]string(nil), s.containers...)
	r.mu.Unlock()
	for _, id := range ids {
		c, err := r.client.LoadContainer(ctx, id)
		if err != nil {
			return runtime.Stats{}, err
		}
		task, err := c.Task(ctx, nil)
		if err != nil {
			return runtime.Stats{}, err
		}
		m, err := task.Metrics(ctx)
		if err != nil {
			return runtime.Stats{}, fmt.Errorf("metrics of %s: %w", id, err)
		}
		data, err := typeurl.UnmarshalAny(m.Data)
		if err != nil {
			return runtime.Stats{}, err
		}
		switch st := data.(type) {
		case *v1.Metrics:
			if st.CPU != nil && st.CPU.Usage != nil {
				out.CPUUsageNanos += st.CPU.Usage.Total
			}
			if st.CPU != nil && st.CPU.Throttling != nil {
				out.ThrottledNanos += st.CPU.Throttling.ThrottledTime
				out.ThrottledPeriods += st.CPU.Throttling.ThrottledPeriods
			}
			if st.Memory != nil && st.Memory.Usage != nil {
				ws := st.Memory.Usage.Usage
				if inactive := st.Memory.TotalInactiveFile; inactive < ws {
					ws -= inactive
				}
				out.MemoryBytes += ws
				if l := st.Memory.Usage.Limit; l < 1<<62 {
					out.MemoryLimitBytes += l
				}
			}
			if st.Pids != nil {
				out.Pids += st.Pids.Current
			}
		case *v2.Metrics:
			if st.CPU != nil {
				out.CPUUsageNanos += st.CPU.UsageUsec * 1000
				out.ThrottledNanos += st.CPU.ThrottledUsec * 1000
				out.ThrottledPeriods += st.CPU.NrThrottled
			}
			if st.Memory != nil {
				ws := st.Memory.Usage
				if st.Memory.InactiveFile < ws {
					ws -= st.Memory.InactiveFile
				}
				out.MemoryBytes += ws
				if st.Memory.UsageLimit < 1<<62 {
					out.MemoryLimitBytes += st.Memory.UsageLimit
				}
			}
			if st.Pids != nil {
				out.Pids += st.Pids.Current
			}
		}
	}
	return out, nil
}
