package api

import (
	"time"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// APIPrefix is where the virtual node serves sandman's own routes beside
// the kubelet API. Through the apiserver they are
// /api/v1/nodes/<node>/proxy/sandman/v1/... (RBAC: nodes/proxy).
const APIPrefix = "/sandman/v1/"

// ImagesRequest names images to pre-pull (POST APIPrefix+"prepull").
type ImagesRequest struct {
	Images []string `json:"images"`
}

// NodeImage is one image on one worker node, as the pre-pull stream and
// GET APIPrefix+"images" report it.
type NodeImage struct {
	Node string `json:"node"`
	runtime.ImageStatus
	// NodeError: the node agent could not be asked.
	NodeError string `json:"node_error,omitempty"`
}

// PrePullLine is one line of the pre-pull stream (NDJSON): every (node,
// image) pair, and, on the last line, Done with Ready saying whether the
// images are ready on every node.
type PrePullLine struct {
	Time  time.Time   `json:"time"`
	Nodes []NodeImage `json:"nodes"`
	Done  bool        `json:"done,omitempty"`
	Ready bool        `json:"ready,omitempty"`
}

// AnnotationSnapshots names the snapshots taken of a pod: a JSON list of
// SnapshotRecord, newest last, at most MaxSnapshotRecords (the oldest
// dropped). The virtual node writes it after each successful snapshot.
//
// Deprecated: use podcontract.AnnotationSnapshots, where every name of the
// pod contract is defined; this alias stays for trainer code written
// against vk/api.
const AnnotationSnapshots = podcontract.AnnotationSnapshots

// MaxSnapshotRecords bounds the podcontract.AnnotationSnapshots list.
const MaxSnapshotRecords = 20

// SnapshotRecord is one snapshot of a pod, as podcontract.AnnotationSnapshots
// lists it: Image@Digest pins the image it made.
type SnapshotRecord struct {
	Image  string    `json:"image"`
	Digest string    `json:"digest"`
	Time   time.Time `json:"time"`
}

// SnapshotRequest asks the virtual node to snapshot one container of a
// bound pod as a new image (POST APIPrefix+"snapshot"). Container may be
// empty for a pod of one container. Image is a full reference in the
// pool's snapshot registry, or a repository[:tag] there.
type SnapshotRequest struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container,omitempty"`
	Image     string `json:"image"`
}

// SnapshotQueued is the phase of a snapshot waiting for its turn on a
// worker that already takes as many snapshots as it may at once.
const SnapshotQueued runtime.SnapshotPhase = "queued"

// SnapshotLine is one line of the snapshot stream (NDJSON, 200 OK): the
// phase reached (runtime.SnapshotPhase, or SnapshotQueued) with its bytes,
// the worker the pod is bound on and the time since the call began; the
// same line again every few seconds while nothing changes. The last line
// carries either Result or Error with its Code (then Phase is the last
// phase reached). A call refused before the stream begins is answered with
// an HTTP error status and a Kubernetes Status object (kind Status,
// message, code) instead, which client-go reads as an API error.
type SnapshotLine struct {
	Time time.Time `json:"time"`
	Node string    `json:"node,omitempty"`
	runtime.SnapshotProgress
	ElapsedMS int64                   `json:"elapsed_ms"`
	Result    *runtime.SnapshotResult `json:"result,omitempty"`
	Code      string                  `json:"code,omitempty"`
	Error     string                  `json:"error,omitempty"`
}
