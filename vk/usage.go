package vk

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// Resource use over each sandbox's life (GET APIPrefix+"usage", what the
// E2B gateway's metrics calls read): every UsageInterval the virtual node
// reads the running sandboxes' figures from their node agents (Pool.Stats,
// the readings kubectl top shows) and keeps them in a ring per pod, held
// with the pod's record and dropped with it.
//
// Cost, bounded for 20,000 pods: a ring holds at most usageRingSize
// samples of 16 bytes (2 KiB a pod, 40 MiB at 20,000). When it is full,
// every two neighbouring samples become one and the pod is read half as
// often, so the ring covers the pod's whole life: at 5 s, the first
// 10 minutes at 5 s, a day at about 11 minutes. A round reads at most
// UsageRate sandboxes a second (the most overdue first; the rest wait for
// the next round), so 20,000 sandboxes at the default 500 are each read
// about every 40 s rather than every 5.

// usageRingSize is the most samples a pod's ring holds.
const usageRingSize = 128

// usageTick is the unit of a sample's time: 100 ms (a uint32 of them
// spans 13 years).
const usageTick = 100 * time.Millisecond

// usageSample is one reading, compact: the time since the ring's base in
// usageTicks, the CPU milliseconds used since the sample before it
// (since the base for the first), and memory and disk in KiB.
type usageSample struct {
	at      uint32
	cpuMS   uint32
	memKiB  uint32
	diskKiB uint32
}

// usageRing is a pod's samples, oldest first. The provider's mutex guards
// it (it hangs off the pod's sandbox record).
type usageRing struct {
	// base is the sandbox's start: sample times and the first sample's
	// CPU time count from it.
	base    time.Time
	samples []usageSample
	// gap is the least time between two samples; it doubles each time the
	// ring is thinned out. due is when the pod is read next.
	gap time.Duration
	due time.Time
	// lastCPU is the cumulative CPU time at the newest sample (ns).
	lastCPU uint64
	// The latest limits read (0: none).
	memLimit, diskLimit uint64
}

func newUsageRing(base time.Time, gap time.Duration) *usageRing {
	return &usageRing{base: base, gap: gap, due: base}
}

// add records a reading taken at now, unless the ring's gap has not passed
// since its newest sample.
func (r *usageRing) add(now time.Time, st runtime.Stats) {
	if now.Before(r.due) {
		return
	}
	at := now.Sub(r.base) / usageTick
	if at < 0 || (len(r.samples) > 0 && uint32(min(at, math.MaxUint32)) <= r.samples[len(r.samples)-1].at) {
		return
	}
	cpu := st.CPUUsageNanos
	delta := uint64(0)
	if cpu > r.lastCPU {
		delta = cpu - r.lastCPU
	}
	r.lastCPU = max(cpu, r.lastCPU)
	if len(r.samples) == usageRingSize {
		r.thin()
	}
	r.samples = append(r.samples, usageSample{
		at:      uint32(min(at, math.MaxUint32)),
		cpuMS:   sat32(delta / 1e6),
		memKiB:  sat32(st.MemoryBytes >> 10),
		diskKiB: sat32(st.DiskBytes >> 10),
	})
	r.memLimit, r.diskLimit = st.MemoryLimitBytes, st.DiskLimitBytes
	r.due = now.Add(r.gap)
}

// thin makes every two neighbouring samples one (the later's time and
// figures, the pair's CPU time) and doubles the gap.
func (r *usageRing) thin() {
	n := 0
	for i := 0; i < len(r.samples); i += 2 {
		s := r.samples[i]
		if i+1 < len(r.samples) {
			next := r.samples[i+1]
			next.cpuMS = sat32(uint64(s.cpuMS) + uint64(next.cpuMS))
			s = next
		}
		r.samples[n] = s
		n++
	}
	r.samples = r.samples[:n]
	r.gap *= 2
}

func sat32(v uint64) uint32 { return uint32(min(v, math.MaxUint32)) }

// read is the ring's samples whose time is within [start, end] (zero:
// unbounded), for a sandbox of cpus cores and memory limit memDefault
// when its cgroup reports none.
func (r *usageRing) read(start, end time.Time, cpus int64, memDefault uint64) []vkapi.UsageSample {
	var out []vkapi.UsageSample
	prev := uint32(0)
	memLimit := r.memLimit
	if memLimit == 0 {
		memLimit = memDefault
	}
	for _, s := range r.samples {
		at := r.base.Add(time.Duration(s.at) * usageTick)
		span := time.Duration(s.at-prev) * usageTick
		prev = s.at
		if (!start.IsZero() && at.Before(start)) || (!end.IsZero() && at.After(end)) {
			continue
		}
		pct := 0.0
		if span > 0 && cpus > 0 {
			pct = float64(s.cpuMS) * float64(time.Millisecond) / (float64(span) * float64(cpus)) * 100
			pct = math.Round(min(pct, 100)*100) / 100
		}
		out = append(out, vkapi.UsageSample{
			Time: at.UTC(), CPUCount: cpus, CPUUsedPct: pct,
			MemoryBytes: uint64(s.memKiB) << 10, MemoryLimitBytes: memLimit,
			DiskBytes: uint64(s.diskKiB) << 10, DiskLimitBytes: r.diskLimit,
		})
	}
	return out
}

// sandboxCPUs is the cores a sandbox's CPU use is a percentage of: its
// containers' CPU limits, or else requests, rounded up; at least 1.
func sandboxCPUs(req runtime.BindRequest) int64 {
	var limit, request int64
	for _, c := range req.Containers {
		limit += c.Limits.MilliCPU
		request += c.Requests.MilliCPU
	}
	m := limit
	if m == 0 {
		m = request
	}
	return max(1, (m+999)/1000)
}

// sandboxMemory is the memory a sandbox was given when its cgroup reports
// no limit: its containers' memory limits, or else requests (0: a
// container has neither).
func sandboxMemory(req runtime.BindRequest) uint64 {
	var sum uint64
	for _, c := range req.Containers {
		m := c.Limits.MemoryBytes
		if m <= 0 {
			m = c.Requests.MemoryBytes
		}
		if m <= 0 {
			return 0
		}
		sum += uint64(m)
	}
	return sum
}

// recordUsage adds a reading of pod uid to its ring (made at its first
// reading).
func (p *Provider) recordUsage(uid string, st runtime.Stats) {
	if p.cfg.UsageInterval <= 0 {
		return
	}
	now := st.Time
	if now.IsZero() {
		now = p.cfg.Now()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	sb := p.byUID[uid]
	if sb == nil || !sb.started() || sb.terminal() {
		return
	}
	if sb.usage == nil {
		sb.usage = newUsageRing(sb.startedAt, p.cfg.UsageInterval)
	}
	sb.usage.add(now, st)
}

// runUsage samples the running sandboxes every UsageInterval until ctx
// ends.
func (p *Provider) runUsage(ctx context.Context) {
	if p.cfg.UsageInterval <= 0 {
		return
	}
	t := p.cfg.NewTicker(p.cfg.UsageInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			p.sampleUsage(ctx)
		}
	}
}

// sampleUsage reads the running sandboxes that are due, the most overdue
// first, at most UsageRate a second of UsageInterval.
func (p *Provider) sampleUsage(ctx context.Context) {
	now := p.cfg.Now()
	type due struct {
		uid string
		at  time.Time
	}
	var list []due
	p.mu.Lock()
	for uid, sb := range p.byUID {
		if !sb.started() || sb.terminal() || sb.deleting {
			continue
		}
		at := sb.startedAt
		if sb.usage != nil {
			at = sb.usage.due
		}
		if !now.Before(at) {
			list = append(list, due{uid, at})
		}
	}
	p.mu.Unlock()
	slices.SortFunc(list, func(a, b due) int { return a.at.Compare(b.at) })
	if n := max(1, int(p.cfg.UsageRate*p.cfg.UsageInterval.Seconds())); len(list) > n {
		list = list[:n]
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(statsFanOut)
	for _, d := range list {
		g.Go(func() error {
			if st, err := p.cfg.Pool.Stats(gctx, d.uid); err == nil {
				p.recordUsage(d.uid, st)
			}
			return nil
		})
	}
	_ = g.Wait()
}

// serveUsage is GET APIPrefix+"usage": the samples of the pods asked for
// (vkapi.UsageRequest) that this virtual node holds.
func (p *Provider) serveUsage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns, pods := q.Get("namespace"), q["pod"]
	start, errStart := unixParam(q.Get("start"))
	end, errEnd := unixParam(q.Get("end"))
	latest, errLatest := strconv.ParseBool(cmp.Or(q.Get("latest"), "false"))
	if ns == "" || len(pods) == 0 || errStart != nil || errEnd != nil || errLatest != nil {
		statusError(w, vkapi.CodeInvalidArgument, "want ?namespace=NS&pod=NAME (repeatable)&start=UNIX&end=UNIX (optional)&latest=true|false (optional)")
		return
	}
	out := vkapi.UsageResponse{Pods: []vkapi.PodUsage{}}
	p.mu.Lock()
	for _, name := range pods {
		sb := p.byUID[p.byKey[podKey(ns, name)]]
		if sb == nil {
			continue
		}
		pu := vkapi.PodUsage{Namespace: ns, Pod: name, Samples: []vkapi.UsageSample{}}
		if sb.usage != nil {
			s := sb.usage.read(start, end, sandboxCPUs(sb.req), sandboxMemory(sb.req))
			if latest && len(s) > 1 {
				s = s[len(s)-1:]
			}
			if s != nil {
				pu.Samples = s
			}
		}
		out.Pods = append(out.Pods, pu)
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// unixParam reads Unix seconds ("" is the zero time).
func unixParam(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, strconv.ErrSyntax
	}
	return time.Unix(n, 0), nil
}
