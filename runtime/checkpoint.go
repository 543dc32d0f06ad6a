package runtime

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Checkpointer is implemented by runtimes that can keep a sandbox's
// running state: runtime/noderuntime (gVisor sandboxes), runtime/fake and
// the node API client.
//
// Pause checkpoints a bound pod's sandbox — its processes, memory, open
// files and listening sockets — to the node's disk and stops it. The slot
// becomes StatePaused: it keeps the sandbox's filesystem, network
// namespace and address, but no memory or CPU (its requests no longer
// count against the node). Pausing a paused pod does nothing.
//
// Resume restores a paused pod's sandbox in its slot, where it goes on from
// the moment it was paused: the same processes with the same memory, its
// listening sockets listening again at the same address (connections that
// were open are reset). Resume returns once the sandbox runs; readiness
// follows as an EventReady, as after a bind. Resuming a running pod does
// nothing.
//
// Only gVisor sandboxes can be paused: runsc saves and restores the whole
// sandbox. A runc sandbox's processes are the node kernel's, and saving
// them would take CRIU, which is not available.
//
// Errors use errdefs classes: ErrNotFound (the pod is not on this node),
// ErrFailedPrecondition (the pod is not bound or not paused, is binding,
// releasing or being snapshotted, runs under runc, or has several
// containers), ErrResourceExhausted (Pause: the node's disk filled;
// Resume: the pod's requests no longer fit on the node), ErrDataLoss
// (Resume: the checkpoint is gone or cannot be restored; the pod cannot
// go on), ErrUnavailable (the node is draining). A failed Pause leaves the
// sandbox running; a Resume that fails for want of room leaves it paused.
type Checkpointer interface {
	Pause(ctx context.Context, podUID string) (PauseResult, error)
	Resume(ctx context.Context, podUID string) error
}

// PauseResult describes a pause's checkpoint.
type PauseResult struct {
	// Bytes is the checkpoint's size on the node's disk.
	Bytes int64 `json:"bytes"`
}

// ForkSource asks a bind to start its sandbox as a live fork of a running
// sandbox on the same node: the source's processes, memory and files as
// they were at one moment, in a slot, network and writable layer of the
// fork's own, with the fork's tokens (the source's stop working in it).
//
// The source is stopped for an instant and checkpointed, leaving it
// running (runsc checkpoint --leave-running), and its writable layer is
// copied while it is stopped; every bind that names the same ID restores
// from that one checkpoint, so a batch of forks starts from the same
// moment. A later ID takes a new checkpoint. Only a running gVisor
// sandbox of one container forks, into a pod of the same image, also
// under gVisor; connections open in the source are reset in its forks,
// and its listening sockets listen again at the fork's address.
//
// A node keeps a fork's checkpoint until its source is released or
// paused, a newer fork of the source is made, or ForkKeep passes.
type ForkSource struct {
	// PodUID is the source pod's.
	PodUID string `json:"pod_uid"`
	// ID names one fork of the source (one moment): forks that give the
	// same ID start from the same checkpoint.
	ID string `json:"id"`
}

// ForkKeep is how long a node keeps a fork's checkpoint for further forks
// of the same ID.
const ForkKeep = 10 * time.Minute

// MovedCheckpoint is a sandbox's running state pushed to the pool's
// checkpoint repository by a node that moved it away (a drain of a node
// with a checkpoint repository): its checkpoint, its writable layer and
// its daemon's assign token, as an OCI artifact (MediaTypeCheckpoint). A
// bind that names it (BindRequest.Restore) restores the sandbox on its
// node — the same processes, memory and files, a new address — and
// deletes the artifact once it runs. The artifact holds the sandbox's
// memory: the repository must be as private as the sandboxes are.
type MovedCheckpoint struct {
	// Ref is the artifact, by digest (repository@sha256:…).
	Ref string `json:"ref"`
	// Paused: the sandbox was paused when it moved; it stays paused (held
	// by no node) until it is asked to resume.
	Paused bool `json:"paused,omitempty"`
	// From is the node it left; Bytes the artifact's size.
	From  string `json:"from,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
}

// MediaTypeCheckpoint is the config media type of a moved sandbox's
// artifact; its layers are uncompressed tars of the checkpoint image and
// of the writable layer.
const MediaTypeCheckpoint = "application/vnd.sandman.checkpoint.config.v1+json"

// Mover is implemented by runtimes that can move a gVisor sandbox off
// their node (runtime/noderuntime with a checkpoint repository,
// runtime/fake, the node API client): Move pauses it if it runs, pushes
// its state as a drain does, publishes its exit of reason ReasonMoved
// (Event.Moved) and releases its slot. Errors: ErrNotFound (not on this
// node), ErrFailedPrecondition (no checkpoint repository, runc, several
// containers, not bound or paused), and a failed pause's or push's; the
// sandbox then stays as it was (a running one may be left paused here).
type Mover interface {
	Move(ctx context.Context, podUID string) (MovedCheckpoint, error)
}

// CheckpointStore is implemented by runtimes that can delete a moved
// sandbox's artifact (a pod deleted before it was restored): runtime/noderuntime,
// runtime/fake, the node API client. DeleteCheckpoint deletes pod's
// checkpoint ref; a ref that is not pod's (CheckMovedRef, and for
// runtime/noderuntime the pod UID in the artifact's config) is
// ErrInvalidArgument and nothing is deleted.
type CheckpointStore interface {
	DeleteCheckpoint(ctx context.Context, pod PodRef, ref string) error
}

// CheckMovedRef refuses a moved sandbox's checkpoint ref that a node would
// not have pushed for pod: one not named by digest, or whose repository
// does not end in the pod's namespace and name, as a node names them
// (<checkpoint repository>/<namespace>/<pod>@sha256:…). A ref may come
// from the pod itself (podcontract.AnnotationMoved, which its tenant can
// write): this keeps it from naming another pod's checkpoint, to restore
// or to delete. The repository, and the pod UID in the artifact's config,
// are the node's to check. Errors are ErrInvalidArgument.
func CheckMovedRef(ref string, pod PodRef) error {
	name, dgst, byDigest := strings.Cut(ref, "@")
	switch {
	case pod.Namespace == "" || pod.Name == "":
		return fmt.Errorf("checkpoint %q: no pod namespace and name to check it against: %w", ref, errdefs.ErrInvalidArgument)
	case !byDigest || !strings.HasPrefix(dgst, "sha256:"):
		return fmt.Errorf("checkpoint %q is not named by digest (repository@sha256:…): %w", ref, errdefs.ErrInvalidArgument)
	case !strings.HasSuffix(name, "/"+pod.Namespace+"/"+pod.Name):
		return fmt.Errorf("checkpoint %q is not pod %s/%s's (a node pushes its checkpoints to <repository>/%s/%s): %w",
			ref, pod.Namespace, pod.Name, pod.Namespace, pod.Name, errdefs.ErrInvalidArgument)
	}
	return nil
}
