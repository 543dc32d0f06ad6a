package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/containerd/errdefs"
	"k8s.io/client-go/kubernetes"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
	vkclient "github.com/sandman-dev/sandman/vk/client"
)

// snapshotInfo is SnapshotInfo: the answer of POST
// /sandboxes/{id}/snapshots. SnapshotID is IMAGE@DIGEST, which create
// takes as a template ID (an image reference).
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// snapshotRequest is SandboxSnapshotRequest.
type snapshotRequest struct {
	Name string `json:"name"`
}

// virtualNodeSnapshot is Config.Snapshot's default: the virtual node's
// snapshot route through the apiserver's node proxy (RBAC nodes/proxy
// create).
func virtualNodeSnapshot(client kubernetes.Interface) func(context.Context, string, vkapi.SnapshotRequest) (runtime.SnapshotResult, error) {
	return func(ctx context.Context, node string, req vkapi.SnapshotRequest) (runtime.SnapshotResult, error) {
		return vkclient.Snapshot(ctx, client.CoreV1().RESTClient(), node, req, nil)
	}
}

// snapshotImage is the image a snapshot named name (E2B's optional name,
// with an optional :tag) of sandbox id is pushed as, in the pool's
// snapshot registry: <SnapshotRepository>/<namespace>/<name or id>:<tag or
// "default">, E2B's default tag.
func (g *Gateway) snapshotImage(key Key, id, name string) (string, error) {
	repo, tag := id, "default"
	if name != "" {
		repo = name
		if i := strings.LastIndex(name, ":"); i >= 0 {
			repo, tag = name[:i], name[i+1:]
		}
		if repo == "" || tag == "" || strings.Contains(tag, "/") || strings.HasPrefix(repo, "/") || strings.Contains(repo, "..") {
			return "", errorf(errdefs.ErrInvalidArgument, "snapshot name %q: want name or name:tag", name)
		}
	}
	return path.Join(g.cfg.SnapshotRepository, key.Namespace, strings.ToLower(repo)) + ":" + tag, nil
}

// serveSnapshot is POST /sandboxes/{id}/snapshots {name}: the sandbox's
// filesystem changes become an image (processes and memory are not kept,
// unlike E2B's snapshots), and its IMAGE@DIGEST is the snapshot ID, which
// Sandbox.create takes as a template.
func (g *Gateway) serveSnapshot(w http.ResponseWriter, r *http.Request, key Key) {
	id := r.PathValue("sandboxID")
	var req snapshotRequest
	if err := decodeBody(r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	pod, err := g.sandboxPod(r.Context(), key, id)
	if err != nil {
		writeError(w, err)
		return
	}
	image, err := g.snapshotImage(key, id, req.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := g.cfg.Snapshot(r.Context(), pod.Spec.NodeName, vkapi.SnapshotRequest{Namespace: pod.Namespace, Pod: pod.Name, Image: image})
	if err != nil {
		if r.Context().Err() == nil {
			g.log.Info("snapshot failed", "pod", key.Namespace+"/"+id, "key", key.Name, "image", image, "err", err)
			writeError(w, snapshotError(id, err))
		}
		return
	}
	g.log.Info("sandbox snapshotted", "pod", key.Namespace+"/"+id, "key", key.Name, "image", res.Image, "digest", res.Digest)
	writeJSON(w, http.StatusCreated, snapshotInfo{SnapshotID: res.Image + "@" + res.Digest, Names: []string{res.Image}})
}

// snapshotError puts a snapshot's failure in the classes E2B's answers
// use: a sandbox not running (yet, or any more) is a conflict; a refusal
// of the gateway's own call or of the registry's push is the gateway's
// failure (500), not the caller's credentials.
func snapshotError(id string, err error) error {
	msg := fmt.Sprintf("snapshot of sandbox %s: %v", id, err)
	switch {
	case errdefs.IsNotFound(err):
		return errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	case errdefs.IsFailedPrecondition(err):
		return errorf(errdefs.ErrConflict, "%s", msg)
	case errdefs.IsUnauthorized(err), errdefs.IsPermissionDenied(err), errors.Is(err, errdefs.ErrNotImplemented):
		return errors.New(msg)
	case errdefs.IsInvalidArgument(err):
		return errorf(errdefs.ErrInvalidArgument, "%s", msg)
	case errdefs.IsResourceExhausted(err):
		return errorf(errdefs.ErrResourceExhausted, "%s", msg)
	case errdefs.IsUnavailable(err):
		return errorf(errdefs.ErrUnavailable, "%s", msg)
	}
	return errors.New(msg)
}
