package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// TestSnapshotAndCreateFromIt: the SDK's createSnapshot becomes a snapshot
// on the sandbox's virtual node; its snapshotID (IMAGE@DIGEST) is a
// template create takes.
func TestSnapshotAndCreateFromIt(t *testing.T) {
	var mu sync.Mutex
	var asked []vkapi.SnapshotRequest
	var nodes []string
	e := newEnv(t, func(c *Config) {
		c.Snapshot = func(_ context.Context, node string, req vkapi.SnapshotRequest) (runtime.SnapshotResult, error) {
			mu.Lock()
			asked, nodes = append(asked, req), append(nodes, node)
			mu.Unlock()
			switch {
			case strings.Contains(req.Image, "unbound"):
				return runtime.SnapshotResult{}, &vkapi.Error{Code: vkapi.CodeFailedPrecondition, Message: "pod is not bound to a slot yet"}
			case strings.Contains(req.Image, "denied"):
				return runtime.SnapshotResult{}, &vkapi.Error{Code: vkapi.CodePermissionDenied, Message: "push: 403 denied"}
			}
			return runtime.SnapshotResult{Image: "reg.local/" + req.Image, Digest: "sha256:feed"}, nil
		}
	})
	sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})

	r := e.call(http.MethodPost, "/sandboxes/"+sb.SandboxID+"/snapshots", rawKeyA, map[string]any{})
	if r.status != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	var info snapshotInfo
	r.decode(t, &info)
	wantImage := "reg.local/e2b/" + nsA + "/" + sb.SandboxID + ":default"
	if info.SnapshotID != wantImage+"@sha256:feed" || len(info.Names) != 1 || info.Names[0] != wantImage {
		t.Fatalf("snapshot info %s", r.body)
	}
	if asked[0] != (vkapi.SnapshotRequest{Namespace: nsA, Pod: sb.SandboxID, Image: "e2b/" + nsA + "/" + sb.SandboxID + ":default"}) || nodes[0] != pod.Spec.NodeName {
		t.Fatalf("asked %+v on %q", asked[0], nodes[0])
	}

	r = e.call(http.MethodPost, "/sandboxes/"+sb.SandboxID+"/snapshots", rawKeyA, map[string]any{"name": "My-Env:v2"})
	if r.status != http.StatusCreated || asked[1].Image != "e2b/"+nsA+"/my-env:v2" {
		t.Fatalf("named snapshot: %d %s, asked %+v", r.status, r.body, asked[1])
	}

	for _, tc := range []struct {
		name, id string
		body     map[string]any
		status   int
		want     string
	}{
		{"unknown sandbox", "nosuchsandbox", map[string]any{}, http.StatusNotFound, "sandbox nosuchsandbox not found"},
		{"bad name", sb.SandboxID, map[string]any{"name": "env:"}, http.StatusBadRequest, `snapshot name "env:": want name or name:tag`},
		{"not running", sb.SandboxID, map[string]any{"name": "unbound"}, http.StatusConflict, "not bound to a slot yet"},
		{"registry refused", sb.SandboxID, map[string]any{"name": "denied"}, http.StatusInternalServerError, "push: 403 denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.call(http.MethodPost, "/sandboxes/"+tc.id+"/snapshots", rawKeyA, tc.body)
			if r.status != tc.status || !strings.Contains(r.apiError(t).Message, tc.want) {
				t.Fatalf("%d %s", r.status, r.body)
			}
		})
	}
	// Another key's sandbox is not found.
	if r := e.call(http.MethodPost, "/sandboxes/"+sb.SandboxID+"/snapshots", rawKeyB, map[string]any{}); r.status != http.StatusNotFound {
		t.Fatalf("other key: %d %s", r.status, r.body)
	}

	// Sandbox.create(snapshotId): a pod of the snapshot's image.
	_, fork := e.createReady(rawKeyA, nsA, map[string]any{"templateID": info.SnapshotID})
	if img := fork.Spec.Containers[0].Image; img != info.SnapshotID {
		t.Fatalf("fork's image %s", img)
	}
}
