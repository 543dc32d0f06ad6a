package envd

import (
	"context"
	"math"
	"net/http"
	"time"

	"golang.org/x/sys/unix"
)

// metricsBody is envd's answer to GET /metrics.
type metricsBody struct {
	Ts          int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskTotal   uint64  `json:"disk_total"`
	DiskUsed    uint64  `json:"disk_used"`
}

// metrics reports the sandbox's CPU, memory and disk as envd does: from
// its cgroup (v2, or v1's hierarchies) where it has one, else from /proc;
// the disk is the root filesystem's. CPU use is measured since the
// previous call (the first call measures over 100 ms).
func (x *restService) metrics(w http.ResponseWriter, r *http.Request) {
	cg := findCgroup()
	cpus := cg.cpuCount()
	pct, err := x.cpuPercent(r.Context(), cg, cpus)
	if err != nil {
		return // the client went away
	}
	m := metricsBody{Ts: x.s.cfg.Now().Unix(), CPUCount: cpus, CPUUsedPct: pct}
	m.MemTotal, m.MemUsed, m.MemCache = cg.memoryUse()
	m.MemTotalMiB, m.MemUsedMiB = m.MemTotal>>20, m.MemUsed>>20
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err == nil {
		m.DiskTotal = st.Blocks * uint64(st.Bsize)
		m.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, m)
}

// cpuSample is a reading of CPU time: the cgroup's, against wall time, or
// (without a cgroup) the machine's busy and total jiffies.
type cpuSample struct {
	cgroup      bool
	used        time.Duration
	at          time.Time
	busy, total uint64
}

func (x *restService) cpuPercent(ctx context.Context, cg cgroupFiles, cpus int) (float64, error) {
	x.cpuMu.Lock()
	defer x.cpuMu.Unlock()
	prev := x.cpuLast
	if prev == nil {
		s := cg.cpuSample()
		prev = &s
		t := time.NewTimer(100 * time.Millisecond)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-t.C:
		}
	}
	cur := cg.cpuSample()
	x.cpuLast = &cur
	pct := 0.0
	switch {
	case cur.cgroup && prev.cgroup:
		if wall := cur.at.Sub(prev.at); wall > 0 && cpus > 0 {
			pct = 100 * float64(cur.used-prev.used) / float64(wall) / float64(cpus)
		}
	case !cur.cgroup && !prev.cgroup:
		if cur.total > prev.total {
			pct = 100 * float64(cur.busy-prev.busy) / float64(cur.total-prev.total)
		}
	}
	pct = math.Max(0, math.Min(100, pct))
	return math.Round(pct*100) / 100, nil
}
