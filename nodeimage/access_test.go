package nodeimage

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestCredentialsKey(t *testing.T) {
	a := parseDockerConfigs([][]byte{[]byte(`{"auths":{"reg.example":{"username":"u","password":"p"}}}`)})
	// The same credentials written another way, with an unrelated document.
	b := parseDockerConfigs([][]byte{
		[]byte(`{"reg.example":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("u:p")) + `"}}`),
		[]byte(`not json`),
	})
	wrong := parseDockerConfigs([][]byte{[]byte(`{"auths":{"reg.example":{"username":"u","password":"q"}}}`)})
	if credentialsKey(a) == "" || credentialsKey(a) != credentialsKey(b) {
		t.Errorf("the same credentials have keys %q and %q", credentialsKey(a), credentialsKey(b))
	}
	if credentialsKey(a) == credentialsKey(wrong) {
		t.Error("different passwords share a key")
	}
	if credentialsKey(nil) != "" || credentialsKey(parseDockerConfigs([][]byte{[]byte(`{}`)})) != "" {
		t.Error("no credentials have a key")
	}
	if len(credentialsKey(a)) != 64 {
		t.Errorf("key %q is not a SHA-256 digest", credentialsKey(a))
	}
}

// newAccessCache is a cache on a fake clock whose checks run in goroutines
// the test waits for.
func newAccessCache(t *testing.T, clk *clocktesting.FakeClock) *accessCache {
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	return &accessCache{
		now: clk.Now, okTTL: 10 * time.Minute, refusedTTL: 30 * time.Second,
		start:   func(f func()) bool { wg.Go(f); return true },
		entries: map[accessKey]*accessCheck{},
	}
}

func TestAccessCacheOneCheckPerBurst(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	c := newAccessCache(t, clk)
	k := accessKey{"reg.example/x:1", "sha256:a", "creds"}
	var calls atomic.Int32
	release := make(chan struct{})
	check := func(context.Context) error {
		calls.Add(1)
		<-release
		return nil
	}
	const callers = 50
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { errs[i] = c.do(t.Context(), k, check) })
	}
	// One caller gives up: the check goes on for the others.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.do(ctx, k, check); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller that gave up: %v", err)
	}
	close(release)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d checks for a burst of %d callers, want 1", n, callers)
	}
	clk.Step(9 * time.Minute)
	if err := c.do(t.Context(), k, check); err != nil || calls.Load() != 1 {
		t.Fatalf("within the TTL: %v, %d checks", err, calls.Load())
	}
	clk.Step(time.Minute)
	if err := c.do(t.Context(), k, check); err != nil || calls.Load() != 2 {
		t.Fatalf("after the TTL: %v, %d checks, want 2", err, calls.Load())
	}
	// Other credentials are another question.
	if err := c.do(t.Context(), accessKey{k.image, k.digest, "other"}, check); err != nil || calls.Load() != 3 {
		t.Fatalf("other credentials: %v, %d checks, want 3", err, calls.Load())
	}
}

func TestAccessCacheAnswers(t *testing.T) {
	refusal := &Error{Image: "reg.example/x:1", Kind: KindUnauthorized, Err: errors.New("401 Unauthorized")}
	down := &Error{Image: "reg.example/x:1", Kind: KindUnreachable, Err: errors.New("connection refused")}
	for _, tc := range []struct {
		name   string
		answer error
		keep   time.Duration // 0: not kept
	}{
		{"allowed", nil, 10 * time.Minute},
		{"refused", refusal, 30 * time.Second},
		{"not found", &Error{Image: "reg.example/x:1", Kind: KindNotFound, Err: errors.New("404")}, 30 * time.Second},
		{"no answer", down, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			c := newAccessCache(t, clk)
			k := accessKey{"reg.example/x:1", "sha256:a", ""}
			calls := 0
			check := func(context.Context) error { calls++; return tc.answer }
			for range 2 {
				if err := c.do(t.Context(), k, check); !errors.Is(err, tc.answer) && err != tc.answer {
					t.Fatalf("answer %v, want %v", err, tc.answer)
				}
			}
			want := 1
			if tc.keep == 0 {
				want = 2
			}
			if calls != want {
				t.Fatalf("%d checks for two calls, want %d", calls, want)
			}
			if tc.keep > 0 {
				clk.Step(tc.keep)
				_ = c.do(t.Context(), k, check)
				if calls != 2 {
					t.Fatalf("the answer outlived %v", tc.keep)
				}
			}
		})
	}
}

func TestAccessCachePut(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	c := newAccessCache(t, clk)
	k := accessKey{"reg.example/x:1", "sha256:a", "puller"}
	c.put(k)
	fail := func(context.Context) error { t.Error("checked an answer the pull gave"); return nil }
	if err := c.do(t.Context(), k, fail); err != nil {
		t.Fatal(err)
	}
	// An expired answer is dropped when a new question comes.
	clk.Step(11 * time.Minute)
	_ = c.do(t.Context(), accessKey{"reg.example/z:1", "sha256:c", ""}, func(context.Context) error { return nil })
	c.mu.Lock()
	_, old := c.entries[k]
	c.mu.Unlock()
	if old {
		t.Error("an expired answer was kept")
	}
}

func TestAccessCacheStopped(t *testing.T) {
	c := &accessCache{now: time.Now, start: func(func()) bool { return false }, entries: map[accessKey]*accessCheck{}}
	err := c.do(t.Context(), accessKey{"reg.example/x:1", "", ""}, func(context.Context) error { return nil })
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("a stopped manager checked: %v", err)
	}
}

// fakeRegistry serves one manifest to user/pass (HTTP basic auth) and
// counts requests.
func fakeRegistry(t *testing.T, user, pass string) (host string, requests *atomic.Int32) {
	requests = &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/v2/team/task/manifests/v1" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Docker-Content-Digest", "sha256:"+strings.Repeat("a", 64))
		w.Header().Set("Content-Length", "100")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), requests
}

func TestCheckAgainstRegistry(t *testing.T) {
	host, requests := fakeRegistry(t, "trainer", "s3cret")
	m := &Manager{cfg: Config{Node: "t"}, metrics: newMetrics("t"), ctx: context.Background()}
	name := host + "/team/task:v1"
	creds := func(user, pass string) map[string][2]string {
		return parseDockerConfigs([][]byte{[]byte(`{"auths":{"` + host + `":{"username":"` + user + `","password":"` + pass + `"}}}`)})
	}
	if err := m.check(t.Context(), name, creds("trainer", "s3cret")); err != nil {
		t.Fatalf("the right credentials: %v", err)
	}
	for what, c := range map[string]map[string][2]string{"none": nil, "wrong": creds("trainer", "nope")} {
		err := m.check(t.Context(), name, c)
		if KindOf(err) != KindUnauthorized || !errdefs.IsUnauthorized(err) {
			t.Errorf("%s: %v, want unauthorized", what, err)
		}
		if !strings.Contains(err.Error(), "check the pod's imagePullSecrets") || !strings.Contains(err.Error(), "private") {
			t.Errorf("%s: message %q says not what to fix", what, err)
		}
	}
	if requests.Load() == 0 {
		t.Fatal("the registry was not asked")
	}
}
