// Package noderuntime is the real runtime.Runtime: slots on a worker's
// containerd. A warm slot is a network namespace with an address from CNI
// and a state directory; binding one creates the pod's containers from the
// unmodified images with the daemon bind-mounted read-only as PID 1, in the
// slot's namespace. Slot metadata lives in containerd labels and in the
// state directory, so a restarted agent re-adopts running sandboxes.
//
// Sandboxes need Linux: the implementation is in _linux.go files, a file
// per verb (bind, release, recover, hot, snapshot, …), with what needs no
// Linux (configuration, labels, metrics, the hot plan, snapshot images) in
// plain files. Elsewhere the package builds with the same API, and New
// returns an error that wraps errors.ErrUnsupported.
package noderuntime
