package vk

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// AttachAPI adds sandman's routes to mux (the kubelet API's, so they are
// authorized as the kubelet port's other paths, by vk/kubeletauth: nodes/proxy
// get to read, create to pre-pull and snapshot): images, pre-pull,
// snapshot, capacity (JSON), the sandboxes' resource use (usage), and the
// capacity page; authorized, the capacity data names each node's images.
// Their wire types are in package vk/api;
// a call they refuse is answered by statusError, in the one shape clients
// read as a *vkapi.Error.
func (p *Provider) AttachAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET "+vkapi.APIPrefix+"images", p.serveImages)
	mux.HandleFunc("POST "+vkapi.APIPrefix+"prepull", p.servePrePull)
	mux.HandleFunc("POST "+vkapi.APIPrefix+"snapshot", p.serveSnapshot)
	mux.HandleFunc("GET "+vkapi.APIPrefix+"capacity", p.serveCapacity(true))
	mux.HandleFunc("GET "+vkapi.APIPrefix+"usage", p.serveUsage)
	p.attachCapacity(mux, true)
}

func flatten(all []pool.NodeImages, only map[string]bool) []vkapi.NodeImage {
	var out []vkapi.NodeImage
	for _, n := range all {
		if n.Err != nil {
			out = append(out, vkapi.NodeImage{Node: n.Node, NodeError: n.Err.Error()})
			continue
		}
		for _, st := range n.Images {
			if only == nil || only[st.Image] {
				out = append(out, vkapi.NodeImage{Node: n.Node, ImageStatus: st})
			}
		}
	}
	return out
}

func (p *Provider) serveImages(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(flatten(p.cfg.Pool.ImageStatuses(r.Context()), nil))
}

// servePrePull pins images on every node agent and streams their progress
// (NDJSON, every ?interval= seconds, default 0.5) until each is ready or
// failed on every node, or ?timeout= seconds (default 1800) pass.
func (p *Provider) servePrePull(w http.ResponseWriter, r *http.Request) {
	var req vkapi.ImagesRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil || len(req.Images) == 0 {
		statusError(w, vkapi.CodeInvalidArgument, `want {"images": ["ref", ...]}`)
		return
	}
	interval := durationParam(r, "interval", 500*time.Millisecond)
	timeout := durationParam(r, "timeout", 30*time.Minute)
	names := map[string]bool{}
	for _, ref := range req.Images {
		name, err := runtime.NormalizeImage(ref)
		if err != nil {
			statusError(w, vkapi.CodeInvalidArgument, fmt.Sprintf("image %q: %v", ref, err))
			return
		}
		names[name] = true
	}
	ctx := r.Context()
	results := p.cfg.Pool.PrePull(ctx, req.Images)
	if len(results) == 0 {
		statusError(w, vkapi.CodeUnavailable, "the pool has no node agents")
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		line := vkapi.PrePullLine{Time: p.cfg.Now(), Nodes: flatten(p.cfg.Pool.ImageStatuses(ctx), names)}
		// Nodes whose pre-pull request failed say so on every line.
		for _, res := range results {
			if res.Err != nil {
				line.Nodes = append(line.Nodes, vkapi.NodeImage{Node: res.Node, NodeError: res.Err.Error()})
			}
		}
		line.Done, line.Ready = prePullDone(line.Nodes, names)
		if !line.Done && time.Now().After(deadline) {
			line.Done = true
		}
		if enc.Encode(line) != nil || rc.Flush() != nil || line.Done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// prePullDone: every node reports every image ready or failed (done), and
// all of them ready (ready).
func prePullDone(nodes []vkapi.NodeImage, names map[string]bool) (done, ready bool) {
	seen := map[string]map[string]runtime.ImageState{}
	ready = true
	for _, n := range nodes {
		if n.NodeError != "" {
			ready = false
			continue
		}
		if seen[n.Node] == nil {
			seen[n.Node] = map[string]runtime.ImageState{}
		}
		seen[n.Node][n.Image] = n.State
	}
	for _, images := range seen {
		for name := range names {
			switch images[name] {
			case runtime.ImageReady:
			case runtime.ImageFailed:
				ready = false
			default:
				return false, false
			}
		}
	}
	return true, ready && len(seen) > 0
}

func durationParam(r *http.Request, name string, def time.Duration) time.Duration {
	if v, err := strconv.ParseFloat(r.URL.Query().Get(name), 64); err == nil && v > 0 {
		return time.Duration(v * float64(time.Second))
	}
	return def
}
