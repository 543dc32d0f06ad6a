package client

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"k8s.io/client-go/rest"

	"github.com/sandman-dev/sandman/vk/api"
)

// Usage asks the virtual node node for the resource use it sampled of
// pods of one namespace (vk/api UsageRequest; RBAC nodes/proxy get). Pods
// the node does not hold are left out of the answer. Errors are
// *api.Error.
func Usage(ctx context.Context, rc rest.Interface, node string, req api.UsageRequest) (api.UsageResponse, error) {
	r := rc.Get().AbsPath(NodeProxyPath(node, "usage")).Param("namespace", req.Namespace)
	for _, pod := range req.Pods {
		r = r.Param("pod", pod)
	}
	if !req.Start.IsZero() {
		r = r.Param("start", strconv.FormatInt(req.Start.Unix(), 10))
	}
	if !req.End.IsZero() {
		r = r.Param("end", strconv.FormatInt(req.End.Unix(), 10))
	}
	if req.Latest {
		r = r.Param("latest", "true")
	}
	raw, err := r.DoRaw(ctx)
	if err != nil {
		return api.UsageResponse{}, callError(fmt.Sprintf("resource use of pods in %s through node %s", req.Namespace, node), err)
	}
	var out api.UsageResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		return api.UsageResponse{}, &api.Error{Code: api.CodeInternal, Message: fmt.Sprintf("resource use through node %s: %v", node, err)}
	}
	return out, nil
}
