package api

import (
	"time"

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
