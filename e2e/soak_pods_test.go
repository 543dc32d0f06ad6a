//go:build soak && e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/e2e/framework"
)

// notRunning says why a sandbox should not be used any more, from the
// latest pod list: gone, being deleted or ended.
func (r *churnRun) notRunning(name string, uid types.UID) string {
	p, ok, _ := r.watch.get(name, time.Time{})
	switch {
	case !ok || p.UID != uid:
		return "gone while in use"
	case p.DeletionTimestamp != nil:
		return "deleted while in use"
	case terminal(&p):
		return endedAs(&p) + " while in use"
	}
	return ""
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

// endedAs is "Failed NodeLost" and the like.
func endedAs(p *corev1.Pod) string {
	reason := p.Status.Reason
	if reason == "" {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Terminated != nil {
				reason = cs.State.Terminated.Reason
			}
		}
	}
	return strings.TrimSpace(string(p.Status.Phase) + " " + reason)
}

// describe is a pod's state in one line.
func describe(p *corev1.Pod) string {
	if p == nil {
		return "gone"
	}
	s := fmt.Sprintf("phase %s", p.Status.Phase)
	if p.Status.Reason != "" || p.Status.Message != "" {
		s += fmt.Sprintf(" (%s: %s)", p.Status.Reason, p.Status.Message)
	}
	if p.Spec.NodeName == "" {
		s += ", not scheduled"
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf(", %s: %s", c.Type, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			s += fmt.Sprintf(", waiting %s: %s", w.Reason, w.Message)
		}
	}
	if p.DeletionTimestamp != nil {
		s += ", deleting since " + p.DeletionTimestamp.Format(time.TimeOnly)
	}
	return s
}

// createPod creates pod, retrying while the API refuses (an outage) for
// up to 3 minutes. The churn's creations and refusals are counted (not
// those of the fill rounds).
func (r *churnRun) createPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	pods := r.s.Kube.CoreV1().Pods(r.p.ns)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		created, err := pods.Create(cctx, pod, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an earlier attempt went through
			created, err = pods.Get(cctx, pod.Name, metav1.GetOptions{})
		}
		cancel()
		if err == nil {
			if pod.Labels[soakRole] != "warmup" {
				r.mu.Lock()
				r.creates++
				r.mu.Unlock()
			}
			return created, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		r.mu.Lock()
		if pod.Labels[soakRole] != "warmup" {
			r.createErrs++
		}
		if len(r.createErrSamples) < 5 && pod.Labels[soakRole] != "warmup" {
			r.createErrSamples = append(r.createErrSamples, fmt.Sprintf("+%v %v", time.Since(r.start).Round(time.Second), err))
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("create pod %s: refused for 3m: %w", pod.Name, err)
		}
		sleepCtx(ctx, time.Second)
	}
}

// deletePod deletes the pod (this UID only), retrying while the API
// refuses, for up to 3 minutes; a pod already gone is fine.
func (r *churnRun) deletePod(ctx context.Context, name string, uid types.UID) error {
	pods := r.s.Kube.CoreV1().Pods(r.p.ns)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := pods.Delete(dctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		cancel()
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
		sleepCtx(ctx, time.Second)
	}
}

// waitPod polls the pod list until done accepts the pod (nil: gone, or
// replaced by another UID), returning the last state seen and whether
// done accepted it within timeout.
func (r *churnRun) waitPod(ctx context.Context, name string, uid types.UID, timeout time.Duration, done func(*corev1.Pod) bool) (*corev1.Pod, bool) {
	since := time.Now()
	deadline := since.Add(timeout)
	var last *corev1.Pod
	for {
		p, ok, fresh := r.watch.get(name, since)
		if fresh {
			last = nil
			if ok && p.UID == uid {
				last = &p
			}
			if done(last) {
				return last, true
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return last, false
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// podWatch is the churn's view of its sandbox pods, listed every second
// (one request, however many sandboxes wait).
type podWatch struct {
	mu     sync.Mutex
	pods   map[string]corev1.Pod // guarded by mu
	listed time.Time             // guarded by mu: when the last list that worked started
}

func (w *podWatch) run(ctx context.Context, s *framework.Stack, ns string) {
	for ctx.Err() == nil {
		start := time.Now()
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := s.Kube.CoreV1().Pods(ns).List(lctx, metav1.ListOptions{LabelSelector: soakRole + "=sandbox"})
		cancel()
		if err == nil {
			m := make(map[string]corev1.Pod, len(l.Items))
			for _, p := range l.Items {
				m[p.Name] = p
			}
			w.mu.Lock()
			w.pods, w.listed = m, start
			w.mu.Unlock()
		}
		sleepCtx(ctx, time.Second)
	}
}

// get returns the pod as last listed, whether it was listed, and whether
// that list started after since.
func (w *podWatch) get(name string, since time.Time) (corev1.Pod, bool, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.pods[name]
	return p, ok, w.listed.After(since)
}

// running lists the running pods' addresses by name, for the shared
// address check.
func (w *podWatch) running() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]string{}
	for name, p := range w.pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out[name] = p.Status.PodIP
		}
	}
	return out
}
