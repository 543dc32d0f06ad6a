package nodeapi_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

// stalled serves an agent that never answers: each request reports on
// started, then waits for its caller to give up.
func stalled(t *testing.T) (url string, started <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	done := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ch <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(func() { close(done); ts.CloseClientConnections(); ts.Close() })
	return ts.URL, ch
}

// refusedAddr is an address nothing listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestTransportErrors: an error from a call that got no answer matches both
// its cause and its class, and a caller's own cancellation is not reported
// as the agent being unavailable.
func TestTransportErrors(t *testing.T) {
	calls := map[string]func(ctx context.Context, c *nodeapi.Client) error{
		"inventory": func(ctx context.Context, c *nodeapi.Client) error { _, err := c.Inventory(ctx); return err },
		"release":   func(ctx context.Context, c *nodeapi.Client) error { return c.Release(ctx, "uid", 0) },
		"watch":     func(ctx context.Context, c *nodeapi.Client) error { _, _, err := c.Watch(ctx); return err },
	}
	tests := []struct {
		name string
		// call runs fn against an agent set up for the case.
		call        func(t *testing.T, fn func(context.Context, *nodeapi.Client) error) error
		cause       error
		unavailable bool
	}{
		{
			name: "refused",
			call: func(t *testing.T, fn func(context.Context, *nodeapi.Client) error) error {
				return fn(t.Context(), nodeapi.NewClient(refusedAddr(t), "x", nil))
			},
			cause: syscall.ECONNREFUSED, unavailable: true,
		},
		{
			name: "caller deadline",
			call: func(t *testing.T, fn func(context.Context, *nodeapi.Client) error) error {
				url, _ := stalled(t)
				ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
				defer cancel()
				return fn(ctx, nodeapi.NewClient(url, "x", nil))
			},
			cause: context.DeadlineExceeded, unavailable: true,
		},
		{
			name: "client timeout",
			call: func(t *testing.T, fn func(context.Context, *nodeapi.Client) error) error {
				url, _ := stalled(t)
				return fn(t.Context(), nodeapi.NewClient(url, "x", &http.Client{Timeout: 50 * time.Millisecond}))
			},
			cause: context.DeadlineExceeded, unavailable: true,
		},
		{
			name: "caller cancelled",
			call: func(t *testing.T, fn func(context.Context, *nodeapi.Client) error) error {
				url, started := stalled(t)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				go func() {
					select {
					case <-started:
						cancel()
					case <-ctx.Done():
					}
				}()
				return fn(ctx, nodeapi.NewClient(url, "x", nil))
			},
			cause: context.Canceled, unavailable: false,
		},
	}
	for _, tt := range tests {
		for name, fn := range calls {
			t.Run(tt.name+"/"+name, func(t *testing.T) {
				err := tt.call(t, fn)
				if err == nil {
					t.Fatal("call succeeded")
				}
				if !errors.Is(err, tt.cause) {
					t.Errorf("errors.Is(%v, %v) = false", err, tt.cause)
				}
				if got := errors.Is(err, errdefs.ErrUnavailable); got != tt.unavailable {
					t.Errorf("errors.Is(%v, ErrUnavailable) = %v, want %v", err, got, tt.unavailable)
				}
			})
		}
	}
}

// TestNotServing: an agent that runs but does not serve yet answers every
// call with its reason; the client's error is ErrNotServing (the pool asks
// again soon) and still unavailable, with the agent's message. An agent
// that cannot be reached is unavailable but not ErrNotServing.
func TestNotServing(t *testing.T) {
	reason := "starting"
	ts := httptest.NewServer(nodeapi.NotServing(func() string { return "node agent w0 not serving: " + reason }))
	t.Cleanup(ts.Close)
	c := nodeapi.NewClient(ts.URL, "x", nil)
	for name, call := range map[string]func() error{
		"inventory": func() error { _, err := c.Inventory(t.Context()); return err },
		"watch":     func() error { _, _, err := c.Watch(t.Context()); return err },
		"bind":      func() error { _, err := c.Bind(t.Context(), runtime.BindRequest{}); return err },
	} {
		reason = "waiting for containerd (" + name + ")"
		err := call()
		if !errors.Is(err, runtime.ErrNotServing) || !errdefs.IsUnavailable(err) {
			t.Errorf("%s: %v: want ErrNotServing and unavailable", name, err)
		}
		if err == nil || err.Error() != "node agent w0 not serving: "+reason {
			t.Errorf("%s: message %q, want the agent's", name, err)
		}
	}
	_, err := nodeapi.NewClient(refusedAddr(t), "x", nil).Inventory(t.Context())
	if !errdefs.IsUnavailable(err) || errors.Is(err, runtime.ErrNotServing) {
		t.Errorf("unreachable agent: %v: want unavailable, not ErrNotServing", err)
	}
}
