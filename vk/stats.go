package vk

import (
	"context"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/sandman-dev/sandman/runtime"
)

// Resource use of the virtual node, as a kubelet reports it: /stats/summary
// and /metrics/resource (what metrics-server scrapes, so kubectl top and the
// HPA work on sandboxes). The figures are the node agents' cgroup readings of
// each running sandbox (Pool.Stats); the node's are their sums.

// statsFanOut caps the node agent stats calls in flight during one scrape.
const statsFanOut = 32

// podUsage is one sandbox at a scrape.
type podUsage struct {
	ref   statsv1alpha1.PodReference
	start time.Time
	// container is the pod's first container: the node agent measures
	// the sandbox's cgroup as a whole, not each container, so the pod's
	// figures are reported as that container's.
	container string
	running   bool
	stats     *runtime.Stats
}

// collectStats reads every running sandbox's resource use from its node
// agent, and returns the node's CPU time (see cpuSeen) and how many
// readings failed (a sandbox that went away meanwhile is no failure).
func (p *Provider) collectStats(ctx context.Context) (pods []podUsage, nodeCPU uint64, failed int) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.mu.Lock()
	for uid, sb := range p.byUID {
		u := podUsage{
			ref:     statsv1alpha1.PodReference{Name: sb.pod.Name, Namespace: sb.pod.Namespace, UID: uid},
			start:   sb.startedAt,
			running: sb.started() && !sb.terminal(),
		}
		if len(sb.pod.Spec.Containers) > 0 {
			u.container = sb.pod.Spec.Containers[0].Name
		}
		pods = append(pods, u)
	}
	p.mu.Unlock()

	errs := make([]error, len(pods))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(statsFanOut)
	for i := range pods {
		if !pods[i].running {
			continue
		}
		g.Go(func() error {
			st, err := p.cfg.Pool.Stats(gctx, string(pods[i].ref.UID))
			if err != nil {
				errs[i] = err
				return nil
			}
			pods[i].stats = &st
			p.recordUsage(string(pods[i].ref.UID), st)
			return nil
		})
	}
	_ = g.Wait()

	seen := make(map[string]uint64, len(pods))
	for i, u := range pods {
		uid := u.ref.UID
		switch {
		case u.stats != nil:
			seen[uid] = max(u.stats.CPUUsageNanos, p.cpuSeen[uid])
		case u.running:
			// Keep the last reading of a sandbox that did not answer, so
			// its CPU time is neither dropped nor counted twice.
			if v, ok := p.cpuSeen[uid]; ok {
				seen[uid] = v
			}
			if !errdefs.IsNotFound(errs[i]) {
				failed++
				p.log.Debug("sandbox stats", "pod", u.ref.Namespace+"/"+u.ref.Name, "err", errs[i])
			}
		}
	}
	for uid, v := range p.cpuSeen {
		if _, ok := seen[uid]; !ok {
			p.cpuRetired += v
		}
	}
	p.cpuSeen = seen
	nodeCPU = p.cpuRetired
	for _, v := range seen {
		nodeCPU += v
	}
	sort.Slice(pods, func(i, j int) bool {
		a, b := pods[i].ref, pods[j].ref
		return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
	})
	return pods, nodeCPU, failed
}

// GetStatsSummary implements nodeutil.Provider: per-sandbox CPU and memory
// from the node agents' cgroup figures, for kubectl top and metrics-server.
func (p *Provider) GetStatsSummary(ctx context.Context) (*statsv1alpha1.Summary, error) {
	s, _ := p.summary(ctx)
	return s, nil
}

// summary is the stats summary and the number of failed readings.
func (p *Provider) summary(ctx context.Context) (*statsv1alpha1.Summary, int) {
	now := p.cfg.Now()
	pods, nodeCPU, failed := p.collectStats(ctx)
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.cfg.NodeName, StartTime: metav1.NewTime(p.started)}}
	var nodeMem uint64
	for _, u := range pods {
		ps := statsv1alpha1.PodStats{PodRef: u.ref, StartTime: metav1.NewTime(u.start)}
		if st := u.stats; st != nil {
			at := st.Time
			if at.IsZero() {
				at = now
			}
			cpu, mem := st.CPUUsageNanos, st.MemoryBytes
			ps.CPU = &statsv1alpha1.CPUStats{Time: metav1.NewTime(at), UsageCoreNanoSeconds: &cpu}
			ps.Memory = &statsv1alpha1.MemoryStats{Time: metav1.NewTime(at), WorkingSetBytes: &mem, UsageBytes: &mem}
			if u.container != "" {
				// The sandbox's figures, as its first container's (podUsage).
				ps.Containers = []statsv1alpha1.ContainerStats{{Name: u.container, StartTime: ps.StartTime, CPU: ps.CPU, Memory: ps.Memory}}
			}
			nodeMem += mem
		}
		s.Pods = append(s.Pods, ps)
	}
	if p.cfg.SelfUsage != nil {
		cpu, mem := p.cfg.SelfUsage()
		nodeCPU += cpu
		nodeMem += mem
	}
	s.Node.CPU = &statsv1alpha1.CPUStats{Time: metav1.NewTime(now), UsageCoreNanoSeconds: &nodeCPU}
	s.Node.Memory = &statsv1alpha1.MemoryStats{Time: metav1.NewTime(now), WorkingSetBytes: &nodeMem, UsageBytes: &nodeMem}
	return s, failed
}

// GetMetricsResource implements nodeutil.Provider (/metrics/resource, what
// metrics-server scrapes): the summary's figures as a kubelet writes them.
func (p *Provider) GetMetricsResource(ctx context.Context) ([]*dto.MetricFamily, error) {
	s, failed := p.summary(ctx)
	return resourceMetrics(s, failed), nil
}

// The kubelet's resource metrics (pkg/kubelet/metrics/collectors/
// resource_metrics.go): names, help with the stability level as the kubelet
// prints it, label names. Labels are written sorted by name, as the
// Prometheus client writes them.
var (
	rmNodeCPU = resourceMetric{"node_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the node in core-seconds", dto.MetricType_COUNTER}
	rmNodeMem = resourceMetric{"node_memory_working_set_bytes", "[STABLE] Current working set of the node in bytes", dto.MetricType_GAUGE}
	rmStart   = resourceMetric{"container_start_time_seconds", "[STABLE] Start time of the container since unix epoch in seconds", dto.MetricType_GAUGE}
	rmCtrCPU  = resourceMetric{"container_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the container in core-seconds", dto.MetricType_COUNTER}
	rmCtrMem  = resourceMetric{"container_memory_working_set_bytes", "[STABLE] Current working set of the container in bytes", dto.MetricType_GAUGE}
	rmPodCPU  = resourceMetric{"pod_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the pod in core-seconds", dto.MetricType_COUNTER}
	rmPodMem  = resourceMetric{"pod_memory_working_set_bytes", "[STABLE] Current working set of the pod in bytes", dto.MetricType_GAUGE}
	rmScrape  = resourceMetric{"scrape_error", "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise", dto.MetricType_GAUGE}
	rmScrape2 = resourceMetric{"resource_scrape_error", "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise", dto.MetricType_GAUGE}
)

type resourceMetric struct {
	name, help string
	typ        dto.MetricType
}

// family is a metric family being filled.
type family struct {
	mf *dto.MetricFamily
}

func (m resourceMetric) family() family {
	typ := m.typ
	return family{&dto.MetricFamily{Name: &m.name, Help: &m.help, Type: &typ}}
}

// add appends a sample; at zero: no timestamp (the kubelet writes none
// for start times and scrape errors).
func (f family) add(v float64, at time.Time, labels ...string) {
	m := &dto.Metric{}
	for i := 0; i+1 < len(labels); i += 2 {
		m.Label = append(m.Label, &dto.LabelPair{Name: &labels[i], Value: &labels[i+1]})
	}
	if f.mf.GetType() == dto.MetricType_COUNTER {
		m.Counter = &dto.Counter{Value: &v}
	} else {
		m.Gauge = &dto.Gauge{Value: &v}
	}
	if !at.IsZero() {
		ms := at.UnixMilli()
		m.TimestampMs = &ms
	}
	f.mf.Metric = append(f.mf.Metric, m)
}

// resourceMetrics renders a summary as the kubelet's /metrics/resource
// does: node, container and pod series with the time of their reading, and
// scrape_error 1 when a running sandbox's figures could not be read.
// Families without samples are left out (the text format has no empty
// family).
func resourceMetrics(s *statsv1alpha1.Summary, failed int) []*dto.MetricFamily {
	nodeCPU, nodeMem := rmNodeCPU.family(), rmNodeMem.family()
	start, ctrCPU, ctrMem := rmStart.family(), rmCtrCPU.family(), rmCtrMem.family()
	podCPU, podMem := rmPodCPU.family(), rmPodMem.family()
	scrape, scrape2 := rmScrape.family(), rmScrape2.family()
	if c := s.Node.CPU; c != nil && c.UsageCoreNanoSeconds != nil {
		nodeCPU.add(float64(*c.UsageCoreNanoSeconds)/1e9, c.Time.Time)
	}
	if m := s.Node.Memory; m != nil && m.WorkingSetBytes != nil {
		nodeMem.add(float64(*m.WorkingSetBytes), m.Time.Time)
	}
	for _, ps := range s.Pods {
		ns, pod := ps.PodRef.Namespace, ps.PodRef.Name
		for _, cs := range ps.Containers {
			if cs.StartTime.Unix() > 0 {
				start.add(float64(cs.StartTime.UnixNano())/1e9, time.Time{}, "container", cs.Name, "namespace", ns, "pod", pod)
			}
			if c := cs.CPU; c != nil && c.UsageCoreNanoSeconds != nil {
				ctrCPU.add(float64(*c.UsageCoreNanoSeconds)/1e9, c.Time.Time, "container", cs.Name, "namespace", ns, "pod", pod)
			}
			if m := cs.Memory; m != nil && m.WorkingSetBytes != nil {
				ctrMem.add(float64(*m.WorkingSetBytes), m.Time.Time, "container", cs.Name, "namespace", ns, "pod", pod)
			}
		}
		if c := ps.CPU; c != nil && c.UsageCoreNanoSeconds != nil {
			podCPU.add(float64(*c.UsageCoreNanoSeconds)/1e9, c.Time.Time, "namespace", ns, "pod", pod)
		}
		if m := ps.Memory; m != nil && m.WorkingSetBytes != nil {
			podMem.add(float64(*m.WorkingSetBytes), m.Time.Time, "namespace", ns, "pod", pod)
		}
	}
	errVal := 0.0
	if failed > 0 {
		errVal = 1
	}
	scrape.add(errVal, time.Time{})
	scrape2.add(errVal, time.Time{})
	var out []*dto.MetricFamily
	for _, f := range []family{nodeCPU, nodeMem, start, ctrCPU, ctrMem, podCPU, podMem, scrape, scrape2} {
		if len(f.mf.Metric) > 0 {
			out = append(out, f.mf)
		}
	}
	return out
}
