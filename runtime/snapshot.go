package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/containerd/errdefs"
)

// Snapshotter is implemented by runtimes that can commit a bound sandbox's
// filesystem as an image (prepared environments): runtime/noderuntime,
// runtime/fake and the node API client.
//
// Snapshot pauses the pod's sandbox (cgroup freezer), takes the filesystem
// changes of one of its containers against that container's image as one new
// layer, resumes the sandbox, and records the image plus that layer as a new
// image named req.Image. The image is kept on the node (an ordinary image of
// its cache: a fork there pulls nothing) and pushed to the snapshot registry
// so that any node can run it. Processes and memory are not part of a
// snapshot.
//
// progress, when not nil, is called as the snapshot advances, never
// concurrently, and not after Snapshot returns.
//
// Errors use errdefs classes: ErrNotFound (the pod is not on this node),
// ErrFailedPrecondition (the pod is not bound: still binding, releasing),
// ErrInvalidArgument (a bad image reference, one outside the snapshot
// registry or, on a node that keeps snapshots by namespace, outside
// <repository>/<the pod's namespace>/, a pod of several containers without
// Container), ErrUnauthenticated
// or ErrPermissionDenied (the registry refused the push, with its message),
// ErrUnavailable (the registry did not answer), ErrResourceExhausted (the
// node's disk filled). A failed snapshot leaves the sandbox running and
// unfrozen, and no partial image behind.
type Snapshotter interface {
	Snapshot(ctx context.Context, req SnapshotRequest, progress func(SnapshotProgress)) (SnapshotResult, error)
}

// SnapshotRequest asks for a snapshot of a bound pod's sandbox.
type SnapshotRequest struct {
	PodUID string `json:"pod_uid"`
	// Container is the pod container whose filesystem is taken; empty means
	// the pod's only container.
	Container string `json:"container,omitempty"`
	// Image names the result: a full reference (<registry>/<repository>:<tag>)
	// in the node's snapshot registry, or a repository[:tag] there.
	Image string `json:"image"`
}

// SnapshotPhase is where a snapshot is.
type SnapshotPhase string

const (
	// SnapshotFreeze: the sandbox is being paused.
	SnapshotFreeze SnapshotPhase = "freeze"
	// SnapshotDiff: the changes are being written (BytesDone so far).
	SnapshotDiff SnapshotPhase = "diff"
	// SnapshotCommit: the sandbox runs again; the layer is being compressed
	// and the image recorded and unpacked on the node.
	SnapshotCommit SnapshotPhase = "commit"
	// SnapshotPush: the image is being pushed (BytesDone of BytesTotal).
	SnapshotPush SnapshotPhase = "push"
	// SnapshotDone: finished (the last progress call).
	SnapshotDone SnapshotPhase = "done"
)

// SnapshotProgress is one step of a snapshot.
type SnapshotProgress struct {
	Phase      SnapshotPhase `json:"phase"`
	BytesDone  int64         `json:"bytes_done,omitempty"`
	BytesTotal int64         `json:"bytes_total,omitempty"`
}

// SnapshotResult is the image a snapshot made.
type SnapshotResult struct {
	// Image is the normalized reference the image was pushed as, and Digest
	// its manifest's digest (Image@Digest pins it).
	Image  string `json:"image"`
	Digest string `json:"digest"`
	// BaseImage is the image the container ran.
	BaseImage string `json:"base_image"`
	// Layer is the new layer's digest and LayerBytes its size as pushed;
	// DiffBytes is the size of the uncompressed changes.
	Layer      string `json:"layer"`
	LayerBytes int64  `json:"layer_bytes"`
	DiffBytes  int64  `json:"diff_bytes"`
	// Frozen is how long the sandbox was paused, Duration the whole snapshot.
	Frozen   time.Duration `json:"frozen_ns"`
	Duration time.Duration `json:"duration_ns"`
}

// SnapshotOutcomes are the values SnapshotOutcome returns, for metrics
// that start every label at 0.
var SnapshotOutcomes = []string{"ok", "canceled", "deadline_exceeded", "not_found", "failed_precondition",
	"invalid_argument", "registry_refused", "unavailable", "resource_exhausted", "error"}

// SnapshotOutcome is a snapshot's outcome as a metric label: ok, or the
// class of its failure (registry_refused for a push the registry refused,
// resource_exhausted for a full disk).
func SnapshotOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.Canceled), errdefs.IsCanceled(err):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded), errdefs.IsDeadlineExceeded(err):
		return "deadline_exceeded"
	case errdefs.IsNotFound(err):
		return "not_found"
	case errdefs.IsFailedPrecondition(err):
		return "failed_precondition"
	case errdefs.IsInvalidArgument(err):
		return "invalid_argument"
	case errdefs.IsUnauthorized(err), errdefs.IsPermissionDenied(err):
		return "registry_refused"
	case errdefs.IsUnavailable(err):
		return "unavailable"
	case errdefs.IsResourceExhausted(err):
		return "resource_exhausted"
	case errdefs.IsDataLoss(err):
		return "data_loss"
	}
	return "error"
}
