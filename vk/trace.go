package vk

import (
	"context"
	"log/slog"
	"time"
)

// podTrace is when a pod passed each stage on its way to Ready: created
// (sandbox.created, CreatePod) → placed (the pool chose a node) → bound
// (the node API bind answered) → readyOnNode (the node's ready event, on
// the node's clock) → readySeen (the provider took the event) → status
// (its Ready status handed to virtual-kubelet, which writes it).
type podTrace struct {
	placed, bound, readyOnNode, readySeen time.Time
	done                                  bool
}

// stages are the trace's stages in order, with their durations; a stage
// whose ends are unknown (an adopted pod, a pod that never bound) is left
// out.
func (t podTrace) stages(created, status time.Time) []stage {
	points := []struct {
		name     string
		from, to time.Time
	}{
		{"admit", created, t.placed},
		{"bind", t.placed, t.bound},
		{"ready", t.bound, t.readyOnNode},
		{"notify", t.readyOnNode, t.readySeen},
		{"status", t.readySeen, status},
	}
	var out []stage
	for _, p := range points {
		if p.from.IsZero() || p.to.IsZero() {
			continue
		}
		out = append(out, stage{p.name, max(0, p.to.Sub(p.from))})
	}
	return out
}

type stage struct {
	name string
	d    time.Duration
}

// traceReadyLocked records, once, a ready pod's stages: in
// sandman_vk_pod_stage_seconds and, at debug level, one log line with
// each stage's duration and the absolute times (so a benchmark can line
// them up with the apiserver's side).
func (p *Provider) traceReadyLocked(key string, sb *sandbox, status time.Time) {
	if sb.trace.done {
		return
	}
	sb.trace.done = true
	st := sb.trace.stages(sb.created, status)
	attrs := make([]any, 0, 2*len(st)+8)
	attrs = append(attrs, "pod", key, "uid", string(sb.pod.UID))
	for _, s := range st {
		metricStage.WithLabelValues(s.name).Observe(s.d.Seconds())
		attrs = append(attrs, s.name, s.d)
	}
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		attrs = append(attrs, "created_unix_nano", sb.created.UnixNano(), "status_unix_nano", status.UnixNano())
		p.log.Debug("pod ready trace", attrs...)
	}
}
