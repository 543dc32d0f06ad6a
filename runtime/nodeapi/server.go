package nodeapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
)

// Heartbeat is how often a watch stream says it is alive.
const Heartbeat = 10 * time.Second

// errorBody is every error answer.
type errorBody struct {
	Error wireError `json:"error"`
}

// wireError is an error on the wire: its errdefs class as a code (codes).
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Causes are further codes the error carries (an image_pull error
	// that is also not_found).
	Causes []string `json:"causes,omitempty"`
}

// watchLine is one line of a watch stream.
type watchLine struct {
	Inventory *runtime.Inventory `json:"inventory,omitempty"`
	Event     *runtime.Event     `json:"event,omitempty"`
	Heartbeat *time.Time         `json:"heartbeat,omitempty"`
}

type releaseRequest struct {
	UID          string  `json:"uid"`
	GraceSeconds float64 `json:"grace_seconds"`
}

// codes maps errdefs classes to wire codes and HTTP statuses.
var codes = []struct {
	is     func(error) bool
	code   string
	status int
	err    error
}{
	// First: an image error also carries the errdefs class of its cause,
	// a stale leader that of a conflict.
	{func(err error) bool { return errors.Is(err, ErrStaleLeader) }, "stale_leader", http.StatusConflict, ErrStaleLeader},
	{func(err error) bool { return errors.Is(err, runtime.ErrImagePull) }, "image_pull", http.StatusBadGateway, runtime.ErrImagePull},
	{func(err error) bool { return errors.Is(err, runtime.ErrNotServing) }, "not_serving", http.StatusServiceUnavailable, runtime.ErrNotServing},
	{errdefs.IsInvalidArgument, "invalid_argument", http.StatusBadRequest, errdefs.ErrInvalidArgument},
	{errdefs.IsNotFound, "not_found", http.StatusNotFound, errdefs.ErrNotFound},
	{errdefs.IsAlreadyExists, "already_exists", http.StatusConflict, errdefs.ErrAlreadyExists},
	{errdefs.IsResourceExhausted, "resource_exhausted", http.StatusTooManyRequests, errdefs.ErrResourceExhausted},
	{errdefs.IsUnauthorized, "unauthorized", http.StatusUnauthorized, errdefs.ErrUnauthenticated},
	{errdefs.IsPermissionDenied, "permission_denied", http.StatusForbidden, errdefs.ErrPermissionDenied},
	{errdefs.IsUnavailable, "unavailable", http.StatusServiceUnavailable, errdefs.ErrUnavailable},
	{errdefs.IsFailedPrecondition, "failed_precondition", http.StatusPreconditionFailed, errdefs.ErrFailedPrecondition},
	{errdefs.IsDataLoss, "data_loss", http.StatusGone, errdefs.ErrDataLoss},
}

// Server serves a runtime over HTTP.
type Server struct {
	rt    runtime.Runtime
	token [sha256.Size]byte
	// clientCert: callers authenticate with the control plane's TLS
	// client certificate instead of the token.
	clientCert bool
	log        *slog.Logger
	// fence refuses mutating calls of deposed leaders.
	fence fence
}

// ServerConfig configures a Server.
type ServerConfig struct {
	Runtime runtime.Runtime
	// Token is the pool secret every caller must present as a bearer
	// token (the host-process stack, where the node API is plain HTTP).
	Token string
	// ClientCert instead makes every caller present the control plane's
	// client certificate (nodetls): the server is behind a TLS listener
	// with nodetls.ServerTLS. Exactly one of Token and ClientCert is set.
	ClientCert bool
	Logger     *slog.Logger
}

// NewServer returns a Server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Runtime == nil {
		return nil, errors.New("node API: a runtime is required")
	}
	if (cfg.Token == "") == !cfg.ClientCert {
		return nil, errors.New("node API: give either a token (the pool secret) or client certificates (TLS), exactly one")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{rt: cfg.Runtime, token: sha256.Sum256([]byte(cfg.Token)), clientCert: cfg.ClientCert, log: cfg.Logger}, nil
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.Handle("GET /v1/inventory", s.auth(s.inventory))
	mux.Handle("GET /v1/watch", s.auth(s.watch))
	mux.Handle("GET /v1/stats", s.auth(s.stats))
	mux.Handle("GET /v1/images", s.auth(s.images))
	// Every call that changes something is fenced: only the current
	// leader's (HeaderLeaderEpoch) pass.
	mux.Handle("POST /v1/bind", s.auth(s.fenced(s.bind)))
	mux.Handle("POST /v1/release", s.auth(s.fenced(s.release)))
	mux.Handle("POST /v1/images/prepull", s.auth(s.fenced(s.imageList(runtime.ImageCache.PrePull))))
	mux.Handle("POST /v1/images/unpin", s.auth(s.fenced(s.imageList(runtime.ImageCache.Unpin))))
	mux.Handle("POST /v1/drain", s.auth(s.fenced(s.drain)))
	mux.Handle("POST /v1/undrain", s.auth(s.fenced(s.undrain)))
	mux.Handle("POST /v1/leader", s.auth(s.fenced(s.leader)))
	mux.Handle("POST /v1/snapshot", s.auth(s.fenced(s.snapshot)))
	mux.Handle("POST /v1/pause", s.auth(s.fenced(s.pause)))
	mux.Handle("POST /v1/resume", s.auth(s.fenced(s.resume)))
	mux.Handle("POST /v1/checkpoints/delete", s.auth(s.fenced(s.deleteCheckpoint)))
	mux.Handle("POST /v1/move", s.auth(s.fenced(s.move)))
	mux.Handle("POST /v1/egress", s.auth(s.fenced(s.egress)))
	return mux
}

// imagesRequest names images to pre-pull or unpin.
type imagesRequest struct {
	Images []string `json:"images"`
}

func (s *Server) imageCache(w http.ResponseWriter) (runtime.ImageCache, bool) {
	ic, ok := s.rt.(runtime.ImageCache)
	if !ok {
		writeError(w, errors.New("this node agent keeps no image cache"), http.StatusNotImplemented, "not_implemented")
	}
	return ic, ok
}

func (s *Server) images(w http.ResponseWriter, r *http.Request) {
	ic, ok := s.imageCache(w)
	if !ok {
		return
	}
	st, err := ic.ImageStatuses(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, st)
}

func (s *Server) imageList(op func(runtime.ImageCache, context.Context, []string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ic, ok := s.imageCache(w)
		if !ok {
			return
		}
		var req imagesRequest
		err := decode(w, r, 1<<20, &req)
		if err == nil && len(req.Images) == 0 {
			err = errors.New("no images named")
		}
		if err != nil {
			writeError(w, fmt.Errorf("want {\"images\": [\"ref\", ...]}: %w", err), http.StatusBadRequest, "invalid_argument")
			return
		}
		if err := op(ic, r.Context(), req.Images); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// Serve serves on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (s *Server) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.clientCert {
			err := errors.New("not over TLS")
			if r.TLS != nil {
				err = nodetls.CheckCaller(*r.TLS)
			}
			if err != nil {
				writeError(w, fmt.Errorf("%v: %w", err, errdefs.ErrUnauthenticated), http.StatusUnauthorized, "unauthorized")
				return
			}
			h(w, r)
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(tok))
		if !ok || subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
			writeError(w, errors.New("missing or wrong token: the node API takes the pool secret as a bearer token: "+errdefs.ErrUnauthenticated.Error()), http.StatusUnauthorized, "unauthorized")
			return
		}
		h(w, r)
	})
}

// NotServing answers every request with runtime.ErrNotServing (and
// unavailable) and the message msg gives: what an agent serves until its
// runtime is up.
func NotServing(msg func() string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, notServingError(msg()))
	})
}

type notServingError string

func (e notServingError) Error() string { return string(e) }
func (e notServingError) Unwrap() []error {
	return []error{runtime.ErrNotServing, errdefs.ErrUnavailable}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error, status int, code string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, err.Error()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

func writeErr(w http.ResponseWriter, err error) {
	we, status := toWire(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errorBody{Error: we})
}

// toWire is err on the wire, with the HTTP status of its class.
func toWire(err error) (wireError, int) {
	we := wireError{Code: "internal", Message: err.Error()}
	status := http.StatusInternalServerError
	for _, c := range codes {
		if !c.is(err) {
			continue
		}
		if we.Code == "internal" {
			we.Code, status = c.code, c.status
		} else {
			we.Causes = append(we.Causes, c.code)
		}
	}
	return we, status
}

func (s *Server) inventory(w http.ResponseWriter, r *http.Request) {
	inv, err := s.rt.Inventory(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, inv)
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	inv, events, err := s.rt.Watch(ctx)
	if err != nil {
		writeErr(w, err)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	if enc.Encode(watchLine{Inventory: &inv}) != nil || rc.Flush() != nil {
		return
	}
	hb := time.NewTicker(Heartbeat)
	defer hb.Stop()
	for {
		var line watchLine
		select {
		case ev, ok := <-events:
			if !ok {
				return // the watcher fell behind: the client watches again
			}
			line.Event = &ev
		case t := <-hb.C:
			line.Heartbeat = &t
		case <-ctx.Done():
			return
		}
		if enc.Encode(line) != nil {
			return
		}
		// Flush once the burst of queued events is written.
		if len(events) == 0 && rc.Flush() != nil {
			return
		}
	}
}

func (s *Server) bind(w http.ResponseWriter, r *http.Request) {
	var req runtime.BindRequest
	if err := decode(w, r, 4<<20, &req); err != nil {
		writeError(w, err, http.StatusBadRequest, "invalid_argument")
		return
	}
	slot, err := s.rt.Bind(r.Context(), req)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, slot)
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	var req releaseRequest
	if err := decode(w, r, 64<<10, &req); err != nil {
		writeError(w, err, http.StatusBadRequest, "invalid_argument")
		return
	}
	// A release must finish even when the caller goes away.
	ctx := context.WithoutCancel(r.Context())
	if err := s.rt.Release(ctx, req.UID, graceOf(req.GraceSeconds)); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, map[string]string{"uid": req.UID})
}

// podRequest names a pod (pause, resume).
type podRequest struct {
	UID string `json:"uid"`
}

func (s *Server) checkpointer(w http.ResponseWriter, r *http.Request) (runtime.Checkpointer, string, bool) {
	cp, ok := s.rt.(runtime.Checkpointer)
	if !ok {
		writeError(w, errors.New("this node agent's runtime cannot pause sandboxes"), http.StatusNotImplemented, "not_implemented")
		return nil, "", false
	}
	var req podRequest
	err := decode(w, r, 64<<10, &req)
	if err == nil && req.UID == "" {
		err = errors.New("uid is required")
	}
	if err != nil {
		writeError(w, err, http.StatusBadRequest, "invalid_argument")
		return nil, "", false
	}
	return cp, req.UID, true
}

// pause checkpoints a bound pod's sandbox to the node's disk
// (runtime.Checkpointer); it finishes even when the caller goes away.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	cp, uid, ok := s.checkpointer(w, r)
	if !ok {
		return
	}
	res, err := cp.Pause(context.WithoutCancel(r.Context()), uid)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, res)
}

// resume restores a paused pod's sandbox (runtime.Checkpointer).
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	cp, uid, ok := s.checkpointer(w, r)
	if !ok {
		return
	}
	if err := cp.Resume(context.WithoutCancel(r.Context()), uid); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, map[string]string{"uid": uid})
}

// move moves a pod's gVisor sandbox off the node (runtime.Mover); it
// finishes even when the caller goes away.
func (s *Server) move(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.rt.(runtime.Mover)
	if !ok {
		writeError(w, errors.New("this node agent's runtime cannot move sandboxes"), http.StatusNotImplemented, "not_implemented")
		return
	}
	var req podRequest
	err := decode(w, r, 64<<10, &req)
	if err == nil && req.UID == "" {
		err = errors.New("uid is required")
	}
	if err != nil {
		writeError(w, err, http.StatusBadRequest, "invalid_argument")
		return
	}
	moved, err := mv.Move(context.WithoutCancel(r.Context()), req.UID)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, moved)
}

// checkpointRequest names a moved sandbox's artifact and the pod it is
// deleted for, which it must be (runtime.CheckpointStore).
type checkpointRequest struct {
	Pod runtime.PodRef `json:"pod"`
	Ref string         `json:"ref"`
}

// deleteCheckpoint deletes a moved sandbox's artifact from the registry
// (runtime.CheckpointStore): its pod was deleted before it was restored.
func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.rt.(runtime.CheckpointStore)
	if !ok {
		writeError(w, errors.New("this node agent's runtime keeps no moved sandboxes"), http.StatusNotImplemented, "not_implemented")
		return
	}
	var req checkpointRequest
	err := decode(w, r, 64<<10, &req)
	switch {
	case err != nil:
	case req.Ref == "":
		err = errors.New("ref is required")
	case req.Pod.UID == "" || req.Pod.Namespace == "" || req.Pod.Name == "":
		err = errors.New("pod (uid, namespace, name) is required: a checkpoint is deleted only for the pod it is of (is sandman-vk older than sandman-node?)")
	}
	if err != nil {
		writeError(w, err, http.StatusBadRequest, "invalid_argument")
		return
	}
	if err := cs.DeleteCheckpoint(context.WithoutCancel(r.Context()), req.Pod, req.Ref); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, map[string]string{"ref": req.Ref})
}

// egressRequest is a pod's new egress (runtime.EgressSetter).
type egressRequest struct {
	UID string `json:"uid"`
	runtime.Egress
}

// egress replaces a bound pod's egress (runtime.EgressSetter); it finishes
// even when the caller goes away.
func (s *Server) egress(w http.ResponseWriter, r *http.Request) {
	es, ok := s.rt.(runtime.EgressSetter)
	if !ok {
		writeError(w, errors.New("this node agent's runtime cannot change a sandbox's egress"), http.StatusNotImplemented, "not_implemented")
		return
	}
	var req egressRequest
	err := decode(w, r, 1<<20, &req)
	if err == nil && req.UID == "" {
		err = errors.New("uid is required")
	}
	if err != nil {
		writeError(w, err, http.StatusBadRequest, "invalid_argument")
		return
	}
	if err := es.SetEgress(context.WithoutCancel(r.Context()), req.UID, req.Egress); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, map[string]string{"uid": req.UID})
}

// drainRequest says why a node is drained.
type drainRequest struct {
	Reason string `json:"reason"`
}

// drain empties the node (runtime.Drainer): binds refused, every sandbox
// evicted and released, idle slots torn down. It answers when that is done.
func (s *Server) drain(w http.ResponseWriter, r *http.Request) {
	d, ok := s.rt.(runtime.Drainer)
	if !ok {
		writeError(w, errors.New("this node agent's runtime cannot drain"), http.StatusNotImplemented, "not_implemented")
		return
	}
	var req drainRequest
	if err := decode(w, r, 64<<10, &req); err != nil {
		writeError(w, err, http.StatusBadRequest, "invalid_argument")
		return
	}
	if strings.TrimSpace(req.Reason) == "" {
		writeError(w, errors.New("drain: say why (reason)"), http.StatusBadRequest, "invalid_argument")
		return
	}
	if err := d.Drain(context.WithoutCancel(r.Context()), req.Reason); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, map[string]string{"draining": req.Reason})
}

func (s *Server) undrain(w http.ResponseWriter, r *http.Request) {
	d, ok := s.rt.(runtime.Drainer)
	if !ok {
		writeError(w, errors.New("this node agent's runtime cannot drain"), http.StatusNotImplemented, "not_implemented")
		return
	}
	d.Undrain()
	writeJSON(w, map[string]string{"draining": ""})
}

// graceOf is a release's grace_seconds as a Duration: never negative, and
// the longest Duration past what one holds (the conversion would wrap).
func graceOf(seconds float64) time.Duration {
	ns := seconds * float64(time.Second)
	switch {
	case !(ns > 0): // and NaN
		return 0
	case ns >= math.MaxInt64:
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// decode reads a request body that must be one JSON value of at most limit
// bytes into v.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: want a JSON object: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("request body: want one JSON object, found more after it")
	}
	return nil
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	st, err := s.rt.Stats(r.Context(), r.URL.Query().Get("uid"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, st)
}

// snapshotLine is one line of a snapshot's answer (NDJSON): progress
// lines, then a result or an error.
type snapshotLine struct {
	Progress *runtime.SnapshotProgress `json:"progress,omitempty"`
	Result   *runtime.SnapshotResult   `json:"result,omitempty"`
	Error    *wireError                `json:"error,omitempty"`
}

// snapshot takes a snapshot of a bound pod's sandbox (runtime.Snapshotter),
// answering its progress as it goes and its result or error last. A
// request the server can tell is wrong is refused before the stream (400);
// the runtime's own errors come in the stream, with their codes. A caller
// that goes away stops the snapshot (the runtime cleans up).
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	sn, ok := s.rt.(runtime.Snapshotter)
	if !ok {
		writeError(w, errors.New("this node agent's runtime cannot take snapshots"), http.StatusNotImplemented, "not_implemented")
		return
	}
	var req runtime.SnapshotRequest
	err := decode(w, r, 64<<10, &req)
	if err == nil && (req.PodUID == "" || req.Image == "") {
		err = errors.New("snapshot: pod_uid and image are required")
	}
	if err != nil {
		writeError(w, fmt.Errorf(`want {"pod_uid": "...", "image": "...", "container": "..."}: %w`, err), http.StatusBadRequest, "invalid_argument")
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	res, err := sn.Snapshot(r.Context(), req, func(p runtime.SnapshotProgress) {
		if enc.Encode(snapshotLine{Progress: &p}) == nil {
			_ = rc.Flush()
		}
	})
	line := snapshotLine{Result: &res}
	if err != nil {
		we, _ := toWire(err)
		line = snapshotLine{Error: &we}
	}
	_ = enc.Encode(line)
	_ = rc.Flush()
}
