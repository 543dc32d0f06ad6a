package runtimetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// Token is the bearer token the suite's sandboxes accept.
const Token = "runtimetest-token"

// Harness is one runtime under test and what the suite needs to know of it.
type Harness struct {
	Runtime runtime.Runtime
	// Slots is the node's capacity; WarmSlots how many it keeps warm.
	Slots     int
	WarmSlots int
	// Image works and has a shell; NoShellImage has none; MissingImage
	// does not exist in the registry.
	Image        string
	NoShellImage string
	MissingImage string
	// Exec, if set, runs argv in a bound sandbox through its daemon and
	// returns stdout, so the suite can check that sandboxes really run.
	Exec func(ctx context.Context, slot runtime.Slot, token string, argv ...string) (string, error)
	// Timeout bounds each wait (default 30 s).
	Timeout time.Duration
}

// Suite runs the conformance tests; newHarness makes a fresh runtime for
// each one (and cleans it up with t.Cleanup).
func Suite(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"Inventory", testInventory},
		{"BindAndRelease", testBindAndRelease},
		{"BindErrors", testBindErrors},
		{"MissingImage", testMissingImage},
		{"Exhaustion", testExhaustion},
		{"ConcurrentBinds", testConcurrentBinds},
		{"MultiContainer", testMultiContainer},
		{"NoShellImage", testNoShellImage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			if h.Timeout == 0 {
				h.Timeout = 30 * time.Second
			}
			waitWarm(t, h, h.WarmSlots)
			tc.fn(t, h)
		})
	}
}

// Request is a one-container bind request for image.
func Request(uid, image string, cmd ...string) runtime.BindRequest {
	sum := sha256.Sum256([]byte(Token))
	return runtime.BindRequest{
		Pod:         runtime.PodRef{UID: uid, Namespace: "suite", Name: "pod-" + uid},
		Containers:  []runtime.ContainerSpec{{Name: "task", Image: image, Command: cmd}},
		TokenHashes: []string{hex.EncodeToString(sum[:])},
		VirtualNode: "suite-vk",
	}
}

// WaitEvent reads events until match accepts one and returns it, failing
// the test when the watch closes or timeout passes.
func WaitEvent(t testing.TB, events <-chan runtime.Event, timeout time.Duration, what string, match func(runtime.Event) bool) runtime.Event {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("watch closed while waiting for %s", what)
			}
			if match(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s within %v", what, timeout)
		}
	}
}

// poll waits until cond holds.
func poll(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitWarm(t *testing.T, h Harness, n int) {
	t.Helper()
	poll(t, h.Timeout, fmt.Sprintf("%d warm slots", n), func() (bool, error) {
		inv, err := h.Runtime.Inventory(t.Context())
		if err != nil {
			return false, err
		}
		c := inv.Count()
		return c[runtime.StateWarm]+c[runtime.StateHot] >= n, nil
	})
}

// slotOf finds the slot holding uid in the inventory.
func slotOf(t *testing.T, h Harness, uid string) (runtime.Slot, bool) {
	t.Helper()
	inv, err := h.Runtime.Inventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range inv.Slots {
		if s.Pod != nil && s.Pod.UID == uid {
			return s, true
		}
	}
	return runtime.Slot{}, false
}

func release(t *testing.T, h Harness, uid string) {
	t.Helper()
	if err := h.Runtime.Release(t.Context(), uid, time.Second); err != nil {
		t.Fatalf("release %s: %v", uid, err)
	}
}

func testInventory(t *testing.T, h Harness) {
	inv, err := h.Runtime.Inventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inv.Node == "" || inv.Capacity.Slots != h.Slots || len(inv.Slots) > h.Slots {
		t.Fatalf("inventory node %q capacity %d with %d slots; want capacity %d", inv.Node, inv.Capacity.Slots, len(inv.Slots), h.Slots)
	}
	ids := map[string]bool{}
	for _, s := range inv.Slots {
		if ids[s.ID] {
			t.Fatalf("slot id %s twice", s.ID)
		}
		ids[s.ID] = true
		if s.Pod != nil {
			t.Fatalf("fresh node has a pod in slot %s", s.ID)
		}
	}
}

func testBindAndRelease(t *testing.T, h Harness) {
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, events, err := h.Runtime.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	req := Request("bind-1", h.Image)
	slot, err := h.Runtime.Bind(ctx, req)
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	if slot.State != runtime.StateBound || slot.IP == "" || slot.Pod == nil || slot.Pod.UID != "bind-1" || slot.Image != h.Image {
		t.Fatalf("bound slot %+v", slot)
	}
	// The watch sees the slot go binding → bound, then ready.
	var sawBinding, sawBound bool
	WaitEvent(t, events, h.Timeout, "the ready event", func(ev runtime.Event) bool {
		if ev.Slot.ID != slot.ID {
			return false
		}
		switch {
		case ev.Type == runtime.EventSlot && ev.Slot.State == runtime.StateBinding:
			sawBinding = true
		case ev.Type == runtime.EventSlot && ev.Slot.State == runtime.StateBound:
			sawBound = sawBinding
		}
		return ev.Type == runtime.EventReady
	})
	if !sawBound {
		t.Fatal("watch did not see binding then bound before ready")
	}
	if s, ok := slotOf(t, h, "bind-1"); !ok || s.State != runtime.StateBound || !s.Ready {
		t.Fatalf("inventory slot for the pod: %+v (found %v)", s, ok)
	}
	if h.Exec != nil {
		out, err := h.Exec(ctx, slot, Token, "echo", "in-sandbox")
		if err != nil || out != "in-sandbox\n" {
			t.Fatalf("exec in the sandbox: %q %v", out, err)
		}
		if _, err := h.Exec(ctx, slot, "wrong-token", "true"); err == nil {
			t.Fatal("exec with a wrong token succeeded")
		}
	}
	if st, err := h.Runtime.Stats(ctx, "bind-1"); err != nil || st.Pod.UID != "bind-1" {
		t.Fatalf("stats: %+v %v", st, err)
	}
	if _, err := h.Runtime.Bind(ctx, req); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second bind of the same pod: %v, want already exists", err)
	}
	release(t, h, "bind-1")
	release(t, h, "bind-1") // idempotent
	release(t, h, "never-bound")
	poll(t, h.Timeout, "the slot to be warm again", func() (bool, error) {
		inv, err := h.Runtime.Inventory(ctx)
		if err != nil {
			return false, err
		}
		for _, s := range inv.Slots {
			if s.ID == slot.ID {
				return (s.State == runtime.StateWarm || s.State == runtime.StateHot) && s.Pod == nil, nil
			}
		}
		return false, nil
	})
	if _, err := h.Runtime.Stats(ctx, "bind-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("stats after release: %v, want not found", err)
	}
}

func testBindErrors(t *testing.T, h Harness) {
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, events, err := h.Runtime.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	noToken := Request("err-1", h.Image)
	noToken.TokenHashes = nil
	badMem := Request("err-2", h.Image)
	badMem.Containers[0].Limits.MemoryBytes = 1
	dup := Request("err-3", h.Image)
	dup.Containers = append(dup.Containers, dup.Containers[0])
	for name, req := range map[string]runtime.BindRequest{
		"no containers": {Pod: runtime.PodRef{UID: "err-0"}, AllowUnauthenticated: true},
		"no token":      noToken,
		"tiny memory":   badMem,
		"duplicate":     dup,
		"no uid":        Request("", h.Image),
	} {
		if _, err := h.Runtime.Bind(ctx, req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want invalid argument", name, err)
		}
	}
	// The tiny memory limit is reported as an event that says what to fix.
	WaitEvent(t, events, h.Timeout, "an InvalidSpec event for an invalid resource value", func(ev runtime.Event) bool {
		return ev.Type == runtime.EventBindFailed && ev.Slot.Pod != nil && ev.Slot.Pod.UID == "err-2" &&
			ev.Reason == runtime.ReasonInvalidSpec && strings.Contains(ev.Message, "memory limit")
	})
	waitWarm(t, h, h.WarmSlots)
}

func testMissingImage(t *testing.T, h Harness) {
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, events, err := h.Runtime.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = h.Runtime.Bind(ctx, Request("missing-1", h.MissingImage))
	if !errdefs.IsNotFound(err) {
		t.Fatalf("bind of a missing image: %v, want not found", err)
	}
	if d := time.Since(start); d > h.Timeout {
		t.Fatalf("a missing image took %v to fail", d)
	}
	ev := WaitEvent(t, events, h.Timeout, "a bind-failed event", func(ev runtime.Event) bool { return ev.Type == runtime.EventBindFailed })
	if ev.Reason != runtime.ReasonImageNotFound || ev.Message == "" {
		t.Fatalf("bind failed event %+v: want reason %s and the registry's message", ev, runtime.ReasonImageNotFound)
	}
	if _, ok := slotOf(t, h, "missing-1"); ok {
		t.Fatal("the failed pod still holds a slot")
	}
	waitWarm(t, h, h.WarmSlots)
}

func testExhaustion(t *testing.T, h Harness) {
	ctx := t.Context()
	var uids []string
	for i := range h.Slots {
		uid := fmt.Sprintf("full-%d", i)
		// Slots beyond the warm ones are made on demand by real runtimes.
		var err error
		poll(t, h.Timeout, "a slot for "+uid, func() (bool, error) {
			_, err = h.Runtime.Bind(ctx, Request(uid, h.Image))
			return !errdefs.IsResourceExhausted(err), nil
		})
		if err != nil {
			t.Fatalf("bind %s of %d: %v", uid, h.Slots, err)
		}
		uids = append(uids, uid)
	}
	if _, err := h.Runtime.Bind(ctx, Request("one-too-many", h.Image)); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("bind past capacity: %v, want resource exhausted", err)
	}
	release(t, h, uids[0])
	var err error
	poll(t, h.Timeout, "the released slot to take a new pod", func() (bool, error) {
		_, err = h.Runtime.Bind(ctx, Request("after-release", h.Image))
		return !errdefs.IsResourceExhausted(err), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range append(uids[1:], "after-release") {
		release(t, h, uid)
	}
	waitWarm(t, h, h.WarmSlots)
}

func testConcurrentBinds(t *testing.T, h Harness) {
	ctx := t.Context()
	n := min(h.Slots, 4)
	var wg sync.WaitGroup
	slots := make([]runtime.Slot, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid := fmt.Sprintf("conc-%d", i)
			for {
				slots[i], errs[i] = h.Runtime.Bind(ctx, Request(uid, h.Image))
				if !errdefs.IsResourceExhausted(errs[i]) || ctx.Err() != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	ids, ips := map[string]bool{}, map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("bind %d: %v", i, errs[i])
		}
		if ids[slots[i].ID] || ips[slots[i].IP] {
			t.Fatalf("two pods share slot %s or address %s", slots[i].ID, slots[i].IP)
		}
		ids[slots[i].ID], ips[slots[i].IP] = true, true
	}
	for i := range n {
		release(t, h, fmt.Sprintf("conc-%d", i))
	}
	waitWarm(t, h, h.WarmSlots)
}

func testMultiContainer(t *testing.T, h Harness) {
	ctx := t.Context()
	req := Request("multi-1", h.Image)
	side := req.Containers[0]
	side.Name = "sidecar"
	req.Containers = append(req.Containers, side)
	slot, err := h.Runtime.Bind(ctx, req)
	if err != nil {
		t.Fatalf("bind a two-container pod: %v", err)
	}
	if slot.State != runtime.StateBound {
		t.Fatalf("slot %+v", slot)
	}
	release(t, h, "multi-1")
	waitWarm(t, h, h.WarmSlots)
}

// testNoShellImage: a sandbox works in an image without a shell (the
// daemon brings everything it needs).
func testNoShellImage(t *testing.T, h Harness) {
	ctx := t.Context()
	slot, err := h.Runtime.Bind(ctx, Request("noshell-1", h.NoShellImage))
	if err != nil {
		t.Fatalf("bind an image without a shell: %v", err)
	}
	poll(t, h.Timeout, "the sandbox to be ready", func() (bool, error) {
		s, ok := slotOf(t, h, "noshell-1")
		return ok && s.Ready, nil
	})
	if h.Exec != nil {
		out, err := h.Exec(ctx, slot, Token, "/bin/noshell", "hi")
		if err != nil || out != "hi\n" {
			t.Fatalf("exec in the no-shell sandbox: %q %v", out, err)
		}
	}
	release(t, h, "noshell-1")
	waitWarm(t, h, h.WarmSlots)
}
