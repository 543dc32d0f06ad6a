package nodeapi_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

// drainer is a fake runtime that records drains.
type drainer struct {
	*fake.Runtime
	why       []string
	undrained int
}

func (d *drainer) Drain(_ context.Context, why string) error { d.why = append(d.why, why); return nil }
func (d *drainer) Undrain()                                  { d.undrained++ }

var _ runtime.Drainer = (*drainer)(nil)

func TestDrain(t *testing.T) {
	rt, err := fake.New(fake.Config{Node: "api-1", Slots: 2, Images: []string{"busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	d := &drainer{Runtime: rt}
	for _, tc := range []struct {
		name string
		rt   runtime.Runtime
	}{{"drainer", d}, {"plain", rt}} {
		srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: tc.rt, Token: "pool-secret"})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv.Handler())
		c := nodeapi.NewClient(ts.URL, "pool-secret", nil)
		ctx := t.Context()
		if tc.name == "plain" {
			if err := c.Drain(ctx, "worker cordoned"); err == nil || !strings.Contains(err.Error(), "cannot drain") {
				t.Errorf("drain of a runtime that cannot: %v", err)
			}
			ts.Close()
			continue
		}
		if err := c.Drain(ctx, " "); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "say why") {
			t.Errorf("drain without a reason: %v", err)
		}
		if err := c.Drain(ctx, "worker cordoned"); err != nil {
			t.Fatal(err)
		}
		if err := c.Undrain(ctx); err != nil {
			t.Fatal(err)
		}
		if len(d.why) != 1 || d.why[0] != "worker cordoned" || d.undrained != 1 {
			t.Errorf("runtime saw drains %q and %d undrains", d.why, d.undrained)
		}
		if err := nodeapi.NewClient(ts.URL, "wrong", nil).Drain(ctx, "x"); err == nil {
			t.Error("a drain with a wrong token was accepted")
		}
		ts.Close()
	}
}
