package nodeapi_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestPauseResume: pause and resume of the fake node, directly and over
// the wire: a gVisor pod's slot is paused (its requests free for another
// pod) and bound again, ready; a runc pod, an unknown pod and a resume
// that no longer fits fail with the runtime's class and message.
func TestPauseResume(t *testing.T) {
	for _, via := range []string{"direct", "wire"} {
		t.Run(via, func(t *testing.T) {
			rt, err := fake.New(fake.Config{Node: "cp-1", Slots: 3, Resources: runtime.Resources{MilliCPU: 2000, MemoryBytes: 2 << 30}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.Close)
			var cp runtime.Checkpointer = rt
			if via == "wire" {
				srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: "pool-secret"})
				if err != nil {
					t.Fatal(err)
				}
				ts := httptest.NewServer(srv.Handler())
				t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
				cp = nodeapi.NewClient(ts.URL, "pool-secret", nil)
			}
			ctx := t.Context()
			_, events, err := rt.Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			bind := func(uid, handler string, cpu int64) {
				t.Helper()
				req := runtimetest.Request(uid, "busybox")
				req.RuntimeHandler = handler
				req.Containers[0].Requests = runtime.Resources{MilliCPU: cpu, MemoryBytes: 1 << 30}
				if _, err := rt.Bind(ctx, req); err != nil {
					t.Fatal(err)
				}
			}
			state := func(uid string) runtime.SlotState {
				inv, _ := rt.Inventory(ctx)
				for _, s := range inv.Slots {
					if s.Pod != nil && s.Pod.UID == uid {
						return s.State
					}
				}
				return ""
			}
			bind("gv", runtime.RuntimeHandlerRunsc, 1000)
			bind("rc", "", 1000)
			res, err := cp.Pause(ctx, "gv")
			if err != nil || res.Bytes != 1<<30 {
				t.Fatalf("pause: %+v, %v", res, err)
			}
			if st := state("gv"); st != runtime.StatePaused {
				t.Fatalf("paused pod's slot is %q", st)
			}
			if _, err := cp.Pause(ctx, "rc"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU") {
				t.Errorf("pause of a runc pod: %v", err)
			}
			if _, err := cp.Pause(ctx, "nobody"); !errdefs.IsNotFound(err) {
				t.Errorf("pause of an unknown pod: %v", err)
			}
			// The paused pod's requests are free: a third pod fits, and
			// then the paused one no longer does.
			bind("third", "", 1000)
			if err := cp.Resume(ctx, "gv"); !errdefs.IsResourceExhausted(err) {
				t.Fatalf("resume with its requests taken: %v, want ResourceExhausted", err)
			}
			if err := rt.Release(ctx, "third", 0); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); state("third") != ""; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the released pod's slot was not recycled")
				}
			}
			if err := cp.Resume(ctx, "gv"); err != nil {
				t.Fatalf("resume: %v", err)
			}
			runtimetest.WaitEvent(t, events, 10*time.Second, "the resumed pod ready", func(ev runtime.Event) bool {
				return ev.Type == runtime.EventReady && ev.Slot.Pod != nil && ev.Slot.Pod.UID == "gv"
			})
			if err := cp.Resume(ctx, "rc"); err != nil {
				t.Errorf("resume of a running pod: %v", err)
			}
		})
	}
}
