package runtime

import "context"

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
