package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/vk/api"
)

// LabelPool is the label every sandman virtual node carries (its pool).
//
// Deprecated: use podcontract.LabelPool, where every name of the pod
// contract is defined; this alias stays for trainer code written against
// vk/client.
const LabelPool = podcontract.LabelPool

// NodeProxyPath is the apiserver's path to route (e.g. "snapshot") on the
// virtual node named node.
func NodeProxyPath(node, route string) string {
	return "/api/v1/nodes/" + node + "/proxy" + api.APIPrefix + route
}

// PodNode is the sandman virtual node a pod runs on. rc is a REST client
// of the core API group (kubernetes.Interface's CoreV1().RESTClient()).
// Errors are *api.Error: not_found for a pod that does not exist,
// failed_precondition for one not scheduled yet, invalid_argument for one on
// a node that is not a sandman virtual node.
func PodNode(ctx context.Context, rc rest.Interface, namespace, pod string) (string, error) {
	var p struct {
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
	}
	raw, err := rc.Get().AbsPath("/api/v1/namespaces", namespace, "pods", pod).DoRaw(ctx)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return "", &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("pod %s/%s not found", namespace, pod)}
		}
		return "", callError(fmt.Sprintf("reading pod %s/%s", namespace, pod), err)
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("reading pod %s/%s: %v", namespace, pod, err)}
	}
	node := p.Spec.NodeName
	if node == "" {
		return "", &api.Error{Code: api.CodeFailedPrecondition, Message: fmt.Sprintf("pod %s/%s is not scheduled to a node yet", namespace, pod)}
	}
	var n struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	raw, err = rc.Get().AbsPath("/api/v1/nodes", node).DoRaw(ctx)
	switch {
	case apierrors.IsForbidden(err):
		// A caller who may not read nodes: the virtual node's route says
		// whether the pod is its own.
		return node, nil
	case err != nil:
		return "", callError(fmt.Sprintf("reading node %s of pod %s/%s", node, namespace, pod), err)
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return "", &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("reading node %s: %v", node, err)}
	}
	if _, ok := n.Metadata.Labels[podcontract.LabelPool]; !ok {
		return "", &api.Error{Code: api.CodeInvalidArgument,
			Message: fmt.Sprintf("pod %s/%s runs on node %s, which is not a sandman virtual node (no %s label)", namespace, pod, node, podcontract.LabelPool)}
	}
	return node, nil
}

// Snapshot asks the virtual node node for a snapshot of one container of a
// bound pod (vk/api SnapshotRequest; an empty node is found with PodNode)
// and returns the image it made once it is pushed. progress, when not nil,
// is called with each line of the stream but the last (phases, bytes,
// elapsed time; the same line again every few seconds while a phase
// lasts). Errors are *api.Error, whose errdefs class errors.Is finds:
// not_found, failed_precondition (not bound yet), invalid_argument,
// permission_denied (RBAC nodes/proxy create, or the snapshot registry's
// refusal), unavailable, resource_exhausted and so on. Cancelling ctx
// cancels the snapshot on the worker.
func Snapshot(ctx context.Context, rc rest.Interface, node string, req api.SnapshotRequest, progress func(api.SnapshotLine)) (runtime.SnapshotResult, error) {
	if node == "" {
		var err error
		if node, err = PodNode(ctx, rc, req.Namespace, req.Pod); err != nil {
			return runtime.SnapshotResult{}, err
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return runtime.SnapshotResult{}, err
	}
	what := fmt.Sprintf("snapshot of pod %s/%s through node %s", req.Namespace, req.Pod, node)
	stream, err := rc.Post().AbsPath(NodeProxyPath(node, "snapshot")).
		SetHeader("Content-Type", "application/json").Body(body).Stream(ctx)
	if err != nil {
		return runtime.SnapshotResult{}, callError(what, err)
	}
	defer stream.Close()
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last api.SnapshotLine
	for sc.Scan() {
		var line api.SnapshotLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return runtime.SnapshotResult{}, &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("%s: a line of the stream: %v", what, err)}
		}
		switch {
		case line.Error != "":
			return runtime.SnapshotResult{}, &api.Error{Code: line.Code, Message: line.Error}
		case line.Result != nil:
			return *line.Result, nil
		}
		last = line
		if progress != nil {
			progress(line)
		}
	}
	if ctx.Err() != nil {
		return runtime.SnapshotResult{}, &api.Error{Code: api.ErrorCode(ctx.Err()), Message: fmt.Sprintf("%s: %v", what, ctx.Err())}
	}
	why := "no error"
	if err := sc.Err(); err != nil {
		why = err.Error()
	}
	return runtime.SnapshotResult{}, &api.Error{Code: api.CodeUnavailable,
		Message: fmt.Sprintf("%s: the stream ended at phase %q without a result (%s); the snapshot may still have been made: see the pod's %s annotation",
			what, last.Phase, why, podcontract.AnnotationSnapshots)}
}

// callError is an *api.Error for a call client-go answered with err: a
// Kubernetes Status (the virtual node's refusal, or the apiserver's) keeps
// its message and gives the code, anything else is unavailable.
func callError(what string, err error) error {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		st := se.Status()
		code := api.CodeOfStatus(int(st.Code))
		if st.Details != nil {
			for _, c := range st.Details.Causes {
				if c.Type == api.CauseCode {
					code = c.Message
				}
			}
		}
		msg := st.Message
		if msg == "" || strings.HasPrefix(msg, "an error on the server (\"unknown\")") {
			msg = fmt.Sprintf("%s: HTTP %d %s", what, st.Code, st.Reason)
		}
		return &api.Error{Code: code, Message: msg}
	}
	code := api.ErrorCode(err)
	if code == api.CodeInternal {
		// Nothing answered.
		code = api.CodeUnavailable
	}
	return &api.Error{Code: code, Message: fmt.Sprintf("%s: %v", what, err)}
}
