package nodeapi_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/containerd/errdefs"

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
