package nodeapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

// The node API's request decoding, fuzzed through its handler: every body
// either reaches the runtime as exactly the JSON value it holds, or is
// refused with a 400 invalid_argument that says what is wrong; a bind
// request reaches the runtime unchanged over the wire, and the runtime's
// validation comes back to the client as the same error class and message.

const fuzzToken = "pool-secret"

// recorder is a runtime that records what the node API hands it. Bind
// validates as the real runtimes do and otherwise succeeds.
type recorder struct {
	mu       sync.Mutex
	binds    []runtime.BindRequest
	releases []release
	images   [][]string
}

type release struct {
	uid   string
	grace time.Duration
}

var (
	_ runtime.Runtime    = (*recorder)(nil)
	_ runtime.ImageCache = (*recorder)(nil)
)

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.binds, r.releases, r.images = nil, nil, nil
}

func (r *recorder) Bind(_ context.Context, req runtime.BindRequest) (runtime.Slot, error) {
	r.mu.Lock()
	r.binds = append(r.binds, req)
	r.mu.Unlock()
	if err := req.Validate(); err != nil {
		return runtime.Slot{}, err
	}
	pod := req.Pod
	return runtime.Slot{ID: "s-1", State: runtime.StateBound, IP: "10.0.0.2", Pod: &pod, Since: time.Unix(1, 0).UTC()}, nil
}

func (r *recorder) Release(_ context.Context, uid string, grace time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releases = append(r.releases, release{uid, grace})
	return nil
}

func (r *recorder) Watch(context.Context) (runtime.Inventory, <-chan runtime.Event, error) {
	return runtime.Inventory{}, nil, errdefs.ErrNotImplemented
}
func (r *recorder) Inventory(context.Context) (runtime.Inventory, error) {
	return runtime.Inventory{}, nil
}
func (r *recorder) Stats(context.Context, string) (runtime.Stats, error) {
	return runtime.Stats{}, errdefs.ErrNotFound
}
func (r *recorder) PrePull(_ context.Context, images []string) error { return r.image(images) }
func (r *recorder) Unpin(_ context.Context, images []string) error   { return r.image(images) }
func (r *recorder) ImageStatuses(context.Context) ([]runtime.ImageStatus, error) {
	return nil, nil
}

func (r *recorder) image(images []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.images = append(r.images, images)
	return nil
}

func newAPI(f *testing.F) (*recorder, http.Handler) {
	rec := &recorder{}
	srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rec, Token: fuzzToken})
	if err != nil {
		f.Fatal(err)
	}
	return rec, srv.Handler()
}

// post sends body to path and returns the answer.
func post(h http.Handler, path string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+fuzzToken)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// wantRefused checks an answer is a 400 invalid_argument error body whose
// message says something.
func wantRefused(t *testing.T, body []byte, w *httptest.ResponseRecorder) string {
	t.Helper()
	var eb struct {
		Error struct {
			Code, Message string
		}
	}
	if w.Code != http.StatusBadRequest || json.Unmarshal(w.Body.Bytes(), &eb) != nil || eb.Error.Code != "invalid_argument" {
		t.Fatalf("body %q: answer %d %q, want 400 with an invalid_argument error body", body, w.Code, w.Body)
	}
	if msg := eb.Error.Message; msg == "" || strings.Contains(msg, "<nil>") {
		t.Fatalf("body %q: error message %q does not say what is wrong", body, msg)
	}
	return eb.Error.Message
}

// wireString is s as it comes out of JSON: each invalid UTF-8 byte is
// replaced by U+FFFD (encoding/json's rule, which []rune follows too).
func wireString(s string) string { return string([]rune(s)) }

// FuzzBindBody: POST /v1/bind with any body.
func FuzzBindBody(f *testing.F) {
	hash := strings.Repeat("0f", 32)
	for _, seed := range []string{
		`{"pod":{"uid":"u1","namespace":"ns","name":"p"},"containers":[{"name":"main","image":"busybox","command":["sleep","1"],"env":["A=b"],"requests":{"milli_cpu":100,"memory_bytes":67108864},"limits":{"milli_cpu":1000}}],"token_hashes":["` + hash + `"],"restart_policy":"Never"}`,
		`{"pod":{"uid":"u2"},"containers":[{"name":"a","image":"i"},{"name":"b","image":"i","exclusive_cpus":2,"disk_bytes":1073741824}],"allow_unauthenticated":true,"pull_secrets":["e30="],"labels":{"k":"v"}}`,
		`{"pod":{"uid":"u3"},"containers":[{"name":"a","image":"i"}],"token_hashes":["nothex"]}`,
		`{"pod":{"uid":"u4"},"containers":[{"name":"a","image":"i","requests":{"milli_cpu":9223372036854775807}},{"name":"b","image":"i","requests":{"milli_cpu":9223372036854775807}}],"allow_unauthenticated":true}`,
		`{"pod":{"uid":"u5"},"containers":[{"name":"a","image":"i","limits":{"memory_bytes":-1}}],"allow_unauthenticated":true}`,
		`{"pod":{"uid":"u6"},"containers":[],"allow_unauthenticated":true}`,
		`{"pod":{"uid":"u7"},"containers":[{"name":"a","image":"i"}],"allow_unauthenticated":true}{"pod":{"uid":"u8"}}`,
		`{"pod":{"uid":"u9"},"containers":[{"name":"a","image":"i"}],"allow_unauthenticated":true} ]`,
		`{"containers":[{"requests":{"milli_cpu":1.5}}]}`,
		`{"pod":{"uid":1}}`, `{"pod":`, ``, ` `, `null`, `[]`, `"x"`, `{}`, `{"unknown":1}`, "\x00\xff",
	} {
		f.Add([]byte(seed))
	}
	rec, h := newAPI(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec.reset()
		w := post(h, "/v1/bind", body)
		var want runtime.BindRequest
		uerr := json.Unmarshal(body, &want)
		if uerr != nil {
			if len(rec.binds) > 0 {
				t.Fatalf("body %q is not one JSON bind request (%v), yet the runtime was asked to bind %+v", body, uerr, rec.binds[0])
			}
			wantRefused(t, body, w)
			return
		}
		if len(rec.binds) != 1 {
			t.Fatalf("body %q decodes to a bind request, yet the runtime was asked %d times (answer %d %q)", body, len(rec.binds), w.Code, w.Body)
		}
		if got := rec.binds[0]; !reflect.DeepEqual(got, want) {
			t.Fatalf("body %q: the runtime got %+v, want %+v", body, got, want)
		}
		if verr := want.Validate(); verr != nil {
			if msg := wantRefused(t, body, w); msg != wireString(verr.Error()) {
				t.Fatalf("body %q: message %q, want the runtime's %q", body, msg, verr)
			}
			return
		}
		var slot runtime.Slot
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &slot) != nil || slot.Pod == nil || slot.Pod.UID != wireString(want.Pod.UID) {
			t.Fatalf("body %q: a valid request answered %d %q, want 200 and its slot", body, w.Code, w.Body)
		}
	})
}

// FuzzReleaseBody: POST /v1/release with any body. A release the body
// asks for happens (it is never refused for its grace), with a grace that
// is never negative and follows grace_seconds as far as a Duration holds.
func FuzzReleaseBody(f *testing.F) {
	for _, seed := range []string{
		`{"uid":"u1","grace_seconds":30}`, `{"uid":"u1","grace_seconds":0.5}`, `{"uid":"u1"}`,
		`{"uid":"u1","grace_seconds":-5}`, `{"uid":"u1","grace_seconds":1e300}`, `{"uid":"u1","grace_seconds":9223372036.854775807}`,
		`{"uid":"u1","grace_seconds":1e400}`, `{"uid":"u1","grace_seconds":"30"}`, `{"uid":"u1"}{"uid":"u2"}`,
		``, `null`, `{}`, `[1]`, "\xff",
	} {
		f.Add([]byte(seed))
	}
	rec, h := newAPI(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec.reset()
		w := post(h, "/v1/release", body)
		var want struct {
			UID          string  `json:"uid"`
			GraceSeconds float64 `json:"grace_seconds"`
		}
		if err := json.Unmarshal(body, &want); err != nil {
			if len(rec.releases) > 0 {
				t.Fatalf("body %q is not one JSON release request (%v), yet the runtime was asked to release %+v", body, err, rec.releases[0])
			}
			wantRefused(t, body, w)
			return
		}
		if len(rec.releases) != 1 || w.Code != http.StatusOK {
			t.Fatalf("body %q: %d releases, answer %d %q; want one release and 200", body, len(rec.releases), w.Code, w.Body)
		}
		got := rec.releases[0]
		if got.uid != want.UID {
			t.Fatalf("body %q: released %q, want %q", body, got.uid, want.UID)
		}
		ns := want.GraceSeconds * float64(time.Second)
		switch {
		case got.grace < 0:
			t.Fatalf("body %q: negative grace %v", body, got.grace)
		case ns <= 0:
			if got.grace != 0 {
				t.Fatalf("body %q: grace %v, want 0", body, got.grace)
			}
		case ns >= math.MaxInt64:
			if got.grace != time.Duration(math.MaxInt64) {
				t.Fatalf("body %q: grace %v, want the longest Duration", body, got.grace)
			}
		case math.Abs(float64(got.grace)-ns) > 1:
			t.Fatalf("body %q: grace %v, want %vns", body, got.grace, ns)
		}
	})
}

// FuzzImagesBody: POST /v1/images/prepull and /unpin with any body.
func FuzzImagesBody(f *testing.F) {
	for _, seed := range []string{
		`{"images":["busybox"]}`, `{"images":["docker.io/library/debian:12","busybox@sha256:` + strings.Repeat("a", 64) + `"]}`,
		`{"images":[]}`, `{"images":null}`, `{}`, `{"images":"busybox"}`, `{"images":[""]}`, `{"images":["a"]}[`, ``, `null`,
	} {
		f.Add(false, []byte(seed))
	}
	rec, h := newAPI(f)
	f.Fuzz(func(t *testing.T, unpin bool, body []byte) {
		rec.reset()
		path := "/v1/images/prepull"
		if unpin {
			path = "/v1/images/unpin"
		}
		w := post(h, path, body)
		var want struct {
			Images []string `json:"images"`
		}
		if err := json.Unmarshal(body, &want); err != nil || len(want.Images) == 0 {
			if len(rec.images) > 0 {
				t.Fatalf("body %q names no images (%v), yet the runtime got %q", body, err, rec.images[0])
			}
			wantRefused(t, body, w)
			return
		}
		if len(rec.images) != 1 || !reflect.DeepEqual(rec.images[0], want.Images) || w.Code != http.StatusNoContent {
			t.Fatalf("body %q: runtime got %q, answer %d %q; want %q and 204", body, rec.images, w.Code, w.Body, want.Images)
		}
	})
}

// inProcess carries a client's requests to a handler without a socket.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	w := httptest.NewRecorder()
	t.h.ServeHTTP(w, r)
	return w.Result(), nil
}

// FuzzBindOverTheWire: what the virtual node's client sends is what the
// agent's runtime binds, and a request the runtime refuses comes back as
// InvalidArgument with the runtime's message.
func FuzzBindOverTheWire(f *testing.F) {
	hash := strings.Repeat("9c", 32)
	f.Add("uid-1", "ns", "pod", "main", "busybox:1.36", "sleep", "infinity", "PATH=/bin", "/work", "1000:1000", int64(250), int64(64<<20), int64(1000), int64(128<<20), 1, int64(1<<30), hash, "Never", "host", []byte("{}"), false, uint8(1))
	f.Add("uid-2", "", "", "", "", "", "", "", "", "", int64(0), int64(0), int64(0), int64(0), 0, int64(0), "", "", "", []byte(nil), true, uint8(2))
	f.Add("uid-3", "ns", "p", "a", "img", "", "", "=", "", "", int64(-1), int64(0), int64(5), int64(1), -1, int64(-1), "zz", "Sometimes", "", []byte("\xff"), false, uint8(3))
	f.Add("\xff", "n\x00s", "p\u2028", "\"", "i\\", "\xc3", "", "K=\xff", "", "", int64(math.MaxInt64), int64(math.MaxInt64), int64(0), int64(0), 0, int64(0), hash+", "+hash, "Always", "", []byte(nil), false, uint8(2))
	rec, h := newAPI(f)
	client := nodeapi.NewClient("http://agent", fuzzToken, &http.Client{Transport: inProcess{h}})
	f.Fuzz(func(t *testing.T, uid, ns, name, cname, image, cmd, arg, env, dir, user string, reqCPU, reqMem, limCPU, limMem int64, exclusive int, disk int64, hashes, restart, hostname string, secret []byte, unauth bool, n uint8) {
		rec.reset()
		req := runtime.BindRequest{
			Pod: runtime.PodRef{UID: uid, Namespace: ns, Name: name}, Hostname: hostname, VirtualNode: "vn",
			AllowUnauthenticated: unauth, RestartPolicy: restart, Labels: map[string]string{"k": name},
		}
		if hashes != "" {
			req.TokenHashes = strings.Split(hashes, ",")
		}
		if secret != nil {
			req.PullSecrets = [][]byte{secret}
		}
		for i := range int(n % 4) {
			c := runtime.ContainerSpec{Name: cname + strings.Repeat("-", i), Image: image, WorkingDir: dir, User: user,
				Requests: runtime.Resources{MilliCPU: reqCPU, MemoryBytes: reqMem}, Limits: runtime.Resources{MilliCPU: limCPU, MemoryBytes: limMem},
				ExclusiveCPUs: exclusive, DiskBytes: disk}
			if cmd != "" {
				c.Command = []string{cmd}
			}
			if arg != "" {
				c.Args = []string{arg, ""}
			}
			if env != "" {
				c.Env = []string{env}
			}
			req.Containers = append(req.Containers, c)
		}

		slot, err := client.Bind(t.Context(), req)
		if len(rec.binds) != 1 {
			t.Fatalf("the runtime was asked %d times, want once (client error: %v)", len(rec.binds), err)
		}
		wire := onTheWire(req)
		if got := rec.binds[0]; !reflect.DeepEqual(got, wire) {
			t.Fatalf("sent %+v\nthe runtime got %+v\nwant %+v", req, got, wire)
		}
		verr := wire.Validate()
		switch {
		case verr == nil && err != nil:
			t.Fatalf("a valid request failed: %v", err)
		case verr == nil:
			if slot.Pod == nil || slot.Pod.UID != wireString(uid) {
				t.Fatalf("slot %+v does not hold pod %q", slot, uid)
			}
		case !errdefs.IsInvalidArgument(err) || err.Error() != verr.Error():
			t.Fatalf("client error %v (%T), want InvalidArgument %q", err, err, verr)
		}
	})
}

// onTheWire is req as JSON carries it: invalid UTF-8 replaced, and empty
// lists and maps (omitempty) arriving as nil.
func onTheWire(req runtime.BindRequest) runtime.BindRequest {
	strs := func(l []string) []string {
		if len(l) == 0 {
			return nil
		}
		out := make([]string, len(l))
		for i, s := range l {
			out[i] = wireString(s)
		}
		return out
	}
	out := req
	out.Pod = runtime.PodRef{UID: wireString(req.Pod.UID), Namespace: wireString(req.Pod.Namespace), Name: wireString(req.Pod.Name)}
	out.Hostname, out.VirtualNode, out.RestartPolicy = wireString(req.Hostname), wireString(req.VirtualNode), wireString(req.RestartPolicy)
	out.TokenHashes = strs(req.TokenHashes)
	out.Labels = nil
	for k, v := range req.Labels {
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		out.Labels[wireString(k)] = wireString(v)
	}
	out.PullSecrets = nil
	for _, s := range req.PullSecrets {
		if s == nil {
			s = []byte{} // base64 of nothing is "", which decodes to empty
		}
		out.PullSecrets = append(out.PullSecrets, s)
	}
	out.Containers = nil
	for _, c := range req.Containers {
		c.Name, c.Image, c.WorkingDir, c.User = wireString(c.Name), wireString(c.Image), wireString(c.WorkingDir), wireString(c.User)
		c.Command, c.Args, c.Env = strs(c.Command), strs(c.Args), strs(c.Env)
		out.Containers = append(out.Containers, c)
	}
	return out
}
