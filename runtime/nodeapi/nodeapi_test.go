package nodeapi_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

func serve(t *testing.T) (*fake.Runtime, string) {
	t.Helper()
	rt, err := fake.New(fake.Config{Node: "api-1", Slots: 4, Images: []string{"busybox", "noshell"},
		BindLatency: time.Millisecond, ReadyLatency: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: "pool-secret"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { rt.Close(); ts.CloseClientConnections(); ts.Close() })
	return rt, ts.URL
}

// TestConformanceOverTheWire: the client is a runtime.Runtime like any other.
func TestConformanceOverTheWire(t *testing.T) {
	runtimetest.Suite(t, func(t *testing.T) runtimetest.Harness {
		_, url := serve(t)
		return runtimetest.Harness{
			Runtime: nodeapi.NewClient(url, "pool-secret", nil), Slots: 4, WarmSlots: 4,
			Image: "busybox", NoShellImage: "noshell", MissingImage: "nope",
		}
	})
}

func TestWrongToken(t *testing.T) {
	_, url := serve(t)
	for _, tok := range []string{"", "wrong"} {
		c := nodeapi.NewClient(url, tok, nil)
		if _, err := c.Inventory(t.Context()); !errdefs.IsUnauthorized(err) {
			t.Errorf("token %q: err = %v, want unauthorized", tok, err)
		}
		if _, _, err := c.Watch(t.Context()); !errdefs.IsUnauthorized(err) {
			t.Errorf("watch with token %q: err = %v, want unauthorized", tok, err)
		}
	}
}

func TestUnreachable(t *testing.T) {
	c := nodeapi.NewClient("127.0.0.1:1", "x", nil)
	if _, err := c.Inventory(t.Context()); !errdefs.IsUnavailable(err) {
		t.Fatalf("err = %v, want unavailable", err)
	}
}

// TestImagesOverTheWire: pre-pull, statuses and unpin reach the agent's
// image cache; a failed pre-pull says why; bad requests are refused.
func TestImagesOverTheWire(t *testing.T) {
	_, url := serve(t)
	c := nodeapi.NewClient(url, "pool-secret", nil)
	ctx := t.Context()
	if err := c.PrePull(ctx, []string{"busybox", "img:missing"}); err != nil {
		t.Fatal(err)
	}
	var st []runtime.ImageStatus
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if st, err = c.ImageStatuses(ctx); err != nil {
			t.Fatal(err)
		}
		if len(st) == 2 && st[0].State != runtime.ImagePulling && st[1].State != runtime.ImagePulling {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pre-pulls did not finish: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st[1].Image != "img:missing" || st[1].State != runtime.ImageFailed || st[1].ErrorKind != "not_found" || st[1].Error == "" {
		t.Errorf("missing image: %+v", st[1])
	}
	if st[0].Image != "busybox" || st[0].State != runtime.ImageReady || !st[0].Pinned {
		t.Errorf("pre-pulled image: %+v", st[0])
	}
	if err := c.Unpin(ctx, []string{"busybox"}); err != nil {
		t.Fatal(err)
	}
	if st, _ = c.ImageStatuses(ctx); st[0].Pinned {
		t.Errorf("still pinned after unpin: %+v", st[0])
	}
	if err := c.PrePull(ctx, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty pre-pull: %v, want invalid argument", err)
	}
}
