package vk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// snapshotHeartbeat is how often the snapshot stream repeats its last line
// while nothing changes, so the caller sees the call alive (and its
// elapsed time move).
const snapshotHeartbeat = 5 * time.Second

// The pool's queued phase and the wire's are one (a duplicate map key, so a
// compile error, otherwise).
var _ = map[bool]int{pool.SnapshotQueued == vkapi.SnapshotQueued: 0, false: 1}

// serveSnapshot takes a snapshot of one container of a pod bound on this
// virtual node (Pool.Snapshot) and streams its progress (vkapi.SnapshotLine).
// A refusal before the first line is an HTTP error with a Kubernetes
// Status; after it, the last line carries the error. On success the pod's
// AnnotationSnapshots gains the image and a Snapshotted event is recorded.
func (p *Provider) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	start := p.cfg.Now()
	var req vkapi.SnapshotRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil ||
		req.Namespace == "" || req.Pod == "" || strings.TrimSpace(req.Image) == "" {
		statusError(w, vkapi.CodeInvalidArgument, `want {"namespace": NS, "pod": NAME, "container": C (optional), "image": IMAGE}`)
		return
	}
	ctx := r.Context()
	pod, err := p.snapshotPod(ctx, req)
	if err != nil {
		statusError(w, vkapi.ErrorCode(err), err.Error())
		return
	}
	uid := string(pod.UID)
	node, _ := p.cfg.Pool.Placement(uid)
	log := p.log.With("pod", podKey(pod.Namespace, pod.Name), "node", node, "image", req.Image)

	// The snapshot runs in its own goroutine; this one alone writes the
	// response: progress arrives through lines.
	lines := make(chan runtime.SnapshotProgress)
	type outcome struct {
		res runtime.SnapshotResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := p.cfg.Pool.Snapshot(ctx, runtime.SnapshotRequest{PodUID: uid, Container: req.Container, Image: req.Image},
			func(pr runtime.SnapshotProgress) {
				select {
				case lines <- pr:
				case <-ctx.Done():
				}
			})
		if errdefs.IsNotFound(err) {
			// The pod exists and is on this node: what is missing is its slot.
			err = fmt.Errorf("pod %s is not bound to a slot: %v: %w", podKey(pod.Namespace, pod.Name), err, errdefs.ErrFailedPrecondition)
		}
		done <- outcome{res, err}
	}()

	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	streaming := false
	last := vkapi.SnapshotLine{Node: node}
	write := func(line vkapi.SnapshotLine) {
		if !streaming {
			streaming = true
			_ = rc.SetWriteDeadline(time.Time{})
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		line.Time = p.cfg.Now()
		line.ElapsedMS = line.Time.Sub(start).Milliseconds()
		_ = enc.Encode(line)
		_ = rc.Flush()
	}
	tick := p.cfg.NewTicker(snapshotHeartbeat)
	defer tick.Stop()
	for {
		select {
		case pr := <-lines:
			last.SnapshotProgress = pr
			write(last)
		case <-tick.C():
			if streaming {
				write(last)
			}
		case out := <-done:
			if out.err != nil {
				log.Info("snapshot failed", "err", out.err)
				if !streaming {
					statusError(w, vkapi.ErrorCode(out.err), out.err.Error())
					return
				}
				last.Code, last.Error = vkapi.ErrorCode(out.err), out.err.Error()
				write(last)
				return
			}
			// Recorded even if the caller has gone: the image exists.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			p.recordSnapshot(rctx, pod, out.res)
			cancel()
			last.SnapshotProgress = runtime.SnapshotProgress{Phase: runtime.SnapshotDone}
			last.Result = &out.res
			write(last)
			return
		}
	}
}

// snapshotPod is the pod a snapshot request names, checked: it exists, runs
// on this virtual node, is not being deleted, and has the container asked
// for (or only one).
func (p *Provider) snapshotPod(ctx context.Context, req vkapi.SnapshotRequest) (*corev1.Pod, error) {
	key := podKey(req.Namespace, req.Pod)
	pod, err := p.cfg.Client.CoreV1().Pods(req.Namespace).Get(ctx, req.Pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("pod %s not found: %w", key, errdefs.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("reading pod %s: %v: %w", key, err, errdefs.ErrUnavailable)
	case pod.Spec.NodeName == "":
		return nil, fmt.Errorf("pod %s is not scheduled to a node yet: %w", key, errdefs.ErrFailedPrecondition)
	case pod.Spec.NodeName != p.cfg.NodeName:
		return nil, fmt.Errorf("pod %s runs on node %s, not on this pool's virtual node %s: %w", key, pod.Spec.NodeName, p.cfg.NodeName, errdefs.ErrFailedPrecondition)
	case pod.DeletionTimestamp != nil:
		return nil, fmt.Errorf("pod %s is being deleted: %w", key, errdefs.ErrFailedPrecondition)
	}
	var names []string
	for _, c := range pod.Spec.Containers {
		names = append(names, c.Name)
	}
	switch {
	case req.Container == "" && len(names) > 1:
		return nil, fmt.Errorf("pod %s has %d containers (%s): name the one to snapshot: %w", key, len(names), strings.Join(names, ", "), errdefs.ErrInvalidArgument)
	case req.Container != "" && !slices.Contains(names, req.Container):
		return nil, fmt.Errorf("pod %s has no container %q (it has %s): %w", key, req.Container, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
	}
	// What the provider knows of it says more than the pool would.
	p.mu.Lock()
	sb := p.byUID[string(pod.UID)]
	var why string
	switch {
	case sb == nil:
		why = "the virtual node has not taken it yet"
	case sb.failed:
		why = "it failed: " + sb.reason
	case sb.terminal():
		why = "its sandbox has ended"
	case sb.deleting:
		why = "it is being deleted"
	}
	p.mu.Unlock()
	if why != "" {
		return nil, fmt.Errorf("pod %s is not bound to a slot (%s): %w", key, why, errdefs.ErrFailedPrecondition)
	}
	return pod, nil
}

// recordSnapshot adds a snapshot to the pod's AnnotationSnapshots (newest
// last, at most MaxSnapshotRecords) and records a Snapshotted event. A
// failure is logged: the snapshot itself succeeded.
func (p *Provider) recordSnapshot(ctx context.Context, pod *corev1.Pod, res runtime.SnapshotResult) {
	rec := vkapi.SnapshotRecord{Image: res.Image, Digest: res.Digest, Time: p.cfg.Now().UTC().Truncate(time.Second)}
	pods := p.cfg.Client.CoreV1().Pods(pod.Namespace)
	errGone := errors.New("the pod is gone")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return errGone
		}
		list := appendSnapshotRecord(cur.Annotations[podcontract.AnnotationSnapshots], rec)
		value, err := json.Marshal(list)
		if err != nil {
			return err
		}
		// Statuses handed over from now on carry it (sandbox.snapshots).
		p.mu.Lock()
		if sb := p.byUID[string(pod.UID)]; sb != nil {
			sb.snapshots = string(value)
		}
		p.mu.Unlock()
		// The resource version makes a concurrent change a conflict, which
		// is read again and retried.
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": cur.ResourceVersion,
			"annotations":     map[string]string{podcontract.AnnotationSnapshots: string(value)},
		}})
		if err != nil {
			return err
		}
		_, err = pods.Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	// A status handed over before the record, and written after it,
	// dropped it: the next one writes it again.
	p.push(string(pod.UID))
	if err != nil {
		p.log.Warn("could not record a snapshot on its pod", "pod", podKey(pod.Namespace, pod.Name), "image", res.Image, "digest", res.Digest, "err", err)
	}
	p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, podcontract.ReasonSnapshotted, snapshotMessage(res))
}

func snapshotMessage(res runtime.SnapshotResult) string {
	return fmt.Sprintf("snapshot %s@%s: %.1f MB of changes, frozen %d ms", res.Image, res.Digest,
		float64(res.DiffBytes)/1e6, res.Frozen.Milliseconds())
}

// appendSnapshotRecord adds rec to an AnnotationSnapshots value, keeping the
// newest MaxSnapshotRecords. A value that does not parse is replaced.
func appendSnapshotRecord(value string, rec vkapi.SnapshotRecord) []vkapi.SnapshotRecord {
	var list []vkapi.SnapshotRecord
	if value != "" && json.Unmarshal([]byte(value), &list) != nil {
		list = nil
	}
	list = append(list, rec)
	if n := len(list) - vkapi.MaxSnapshotRecords; n > 0 {
		list = list[n:]
	}
	return list
}

// statusError answers a call refused before its stream: the code's HTTP
// status and a Kubernetes Status, which client-go reads as an API error
// with this message (through the apiserver's node proxy too).
func statusError(w http.ResponseWriter, code, message string) {
	status := vkapi.HTTPStatus(code)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: message, Code: int32(status),
		Reason: statusReason(status),
		// The sandman code, for clients that read it.
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: vkapi.CauseCode, Message: code}}},
	})
}

func statusReason(status int) metav1.StatusReason {
	switch status {
	case http.StatusNotFound:
		return metav1.StatusReasonNotFound
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusConflict:
		return metav1.StatusReasonConflict
	case http.StatusServiceUnavailable:
		return metav1.StatusReasonServiceUnavailable
	case http.StatusGatewayTimeout:
		return metav1.StatusReasonTimeout
	}
	return metav1.StatusReasonInternalError
}
