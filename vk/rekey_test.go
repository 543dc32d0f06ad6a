package vk

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	vkapi "github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/daemon"
	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

func TestControlKeysSet(t *testing.T) {
	if _, err := NewControlKeys(nil); err == nil {
		t.Fatal("an empty current key was taken")
	}
	k := mustKeys("a")
	ch := k.Changed()
	// The same keys again: no change.
	if err := k.Set([]byte("a"), []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("Changed closed by a Set that changed nothing")
	default:
	}
	// Duplicates, empty keys and the current key among previous ones are
	// dropped; the caller's slices are copied.
	cur, prev := []byte("b"), []byte("a")
	if err := k.Set(cur, prev, []byte("b"), nil, []byte("a"), []byte("c")); err != nil {
		t.Fatal(err)
	}
	cur[0], prev[0] = 'x', 'x'
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by a rotation")
	}
	if got := fmt.Sprintf("%s %q", k.Current(), k.Previous()); got != `b ["a" "c"]` {
		t.Fatalf("keys %s", got)
	}
	if err := k.Set(nil); err == nil || string(k.Current()) != "b" {
		t.Fatalf("Set(empty): %v, current %q", err, k.Current())
	}
	for _, tc := range []struct {
		known string
		want  string
	}{
		{"", "b a c b"},  // not known: current first
		{"a", "a b c b"}, // on a previous key: that one first
		{"b", "b a c b"},
		{"gone", "b a c b"}, // a key no longer held is not tried
	} {
		var known []byte
		if tc.known != "" {
			known = []byte(tc.known)
		}
		var got []string
		for _, key := range k.set.Load().tryOrder(known) {
			got = append(got, string(key))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("tryOrder(%q) = %v, want %s", tc.known, got, tc.want)
		}
	}
	if got := len(mustKeys("only").set.Load().tryOrder(nil)); got != 1 {
		t.Errorf("one key: %d tries", got)
	}
}

// daemons are real sandbox daemons (package daemon) for the fake node's
// slots: each bind starts one per container with the bind's token hashes,
// reached through Config.DialDaemon at slotIP:49983+i, as in a sandbox.
type daemons struct {
	runtime.Runtime
	t *testing.T

	// mu guards byAddr and refuse.
	mu     sync.Mutex
	byAddr map[string]*httptest.Server
	// refuse makes dials to these addresses fail (an unreachable daemon).
	refuse map[string]bool
}

func newDaemons(t *testing.T) *daemons {
	return &daemons{t: t, byAddr: map[string]*httptest.Server{}, refuse: map[string]bool{}}
}

func (d *daemons) Bind(ctx context.Context, req runtime.BindRequest) (runtime.Slot, error) {
	slot, err := d.Runtime.Bind(ctx, req)
	if err != nil {
		return slot, err
	}
	var hashes [][sha256.Size]byte
	for _, h := range req.TokenHashes {
		sum, err := daemon.ParseTokenHash(h)
		if err != nil {
			return slot, err
		}
		hashes = append(hashes, sum)
	}
	for i := range req.Containers {
		srv, err := daemon.New(daemon.Config{TokenHashes: hashes, AllowUnauthenticated: req.AllowUnauthenticated,
			StateDir: d.t.TempDir(), Dir: d.t.TempDir()})
		if err != nil {
			return slot, err
		}
		ts := httptest.NewServer(srv.Handler())
		d.t.Cleanup(ts.Close)
		d.mu.Lock()
		d.byAddr[slot.IP+":"+strconv.Itoa(daemonapi.Port+i)] = ts
		d.mu.Unlock()
	}
	return slot, nil
}

func (d *daemons) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	d.mu.Lock()
	ts, refused := d.byAddr[addr], d.refuse[addr]
	d.mu.Unlock()
	if ts == nil || refused {
		return nil, fmt.Errorf("dial %s: no daemon there", addr)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", ts.Listener.Addr().String())
}

// waitUp waits until a daemon is at addr: the fake runtime may report a
// pod ready before Bind above has started the pod's daemons.
func (d *daemons) waitUp(t *testing.T, addr string) {
	t.Helper()
	poll(t, "a daemon at "+addr, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.byAddr[addr] != nil
	})
}

func (d *daemons) setRefused(addr string, refused bool) {
	d.mu.Lock()
	d.refuse[addr] = refused
	d.mu.Unlock()
}

// takes says whether the daemon at addr takes tok (authenticated health
// tells its version; otherwise only its status).
func (d *daemons) takes(t *testing.T, addr, tok string) bool {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: d.dial}}
	defer hc.CloseIdleConnections()
	c, err := client.New(addr, client.WithHTTPClient(hc), client.WithToken(tok), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.Health(t.Context())
	if err != nil {
		t.Fatalf("health of %s: %v", addr, err)
	}
	return h.Version != ""
}

// keyedHarness is a provider whose sandboxes run real daemons, with the
// reconciler (and so the re-keying) running every 20 ms.
func keyedHarness(t *testing.T, slots int) (*harness, *daemons) {
	d := newDaemons(t)
	h := newHarnessWith(t, slots, func(f *fake.Runtime) runtime.Runtime { d.Runtime = f; return d }, func(c *Config) {
		c.ControlKeys = mustKeys("k1")
		c.DialDaemon = d.dial
		c.ReconcileInterval = 20 * time.Millisecond
	})
	h.runReconciler(t)
	return h, d
}

// onPrevious is sandman_vk_sandboxes_on_previous_control_key as scraped.
func onPrevious(t *testing.T, p *Provider) int {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "sandman_vk_sandboxes_on_previous_control_key" && len(f.GetMetric()) == 1 {
			return int(f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	t.Fatal("no sandman_vk_sandboxes_on_previous_control_key")
	return 0
}

// control calls the daemon of pod's container as kubectl exec does
// (callPod: each key in turn) with an authenticated call.
func control(ctx context.Context, p *Provider, pod, container string) error {
	_, _, err := p.callPod("ns", pod, container, func(c *client.Client) error { return c.Renew(ctx) })
	return err
}

// TestRekeyRunningSandboxes: a new current key reaches every running
// sandbox's daemons (both containers of a two-container pod), the
// creator's token stays, control calls never fail meanwhile, and once the
// gauge reads 0 the previous key can go with every sandbox still
// reachable; a new sandbox gets the new key.
func TestRekeyRunningSandboxes(t *testing.T) {
	h, d := keyedHarness(t, 4)
	ctx := t.Context()
	pods := []*corev1.Pod{testPod("a", "img"), testPod("b", "img"), testPod("c", "img")}
	pods[2].Spec.Containers = append(pods[2].Spec.Containers, corev1.Container{Name: "side", Image: "img"})
	ips := map[string]string{}
	for _, pod := range pods {
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	for _, pod := range pods {
		ips[pod.Name] = h.wait(t, pod.UID, pod.Name+" Ready", isReady).Status.PodIP
		for i := range pod.Spec.Containers {
			d.waitUp(t, ips[pod.Name]+":"+strconv.Itoa(daemonapi.Port+i))
		}
		if err := control(ctx, h.p, pod.Name, ""); err != nil {
			t.Fatalf("control call to %s: %v", pod.Name, err)
		}
	}
	if n := onPrevious(t, h.p); n != 0 {
		t.Fatalf("%d sandboxes on a previous key before any rotation", n)
	}
	type daemonRef struct{ pod, container, addr, uid string }
	var all []daemonRef
	for _, pod := range pods {
		for i, c := range pod.Spec.Containers {
			all = append(all, daemonRef{pod.Name, c.Name, ips[pod.Name] + ":" + strconv.Itoa(daemonapi.Port+i), string(pod.UID)})
		}
	}

	// Control calls keep going through the rotation.
	stop := make(chan struct{})
	var calls atomic.Int64
	var failures []string
	var failMu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for _, r := range all {
				select {
				case <-stop:
					return
				default:
				}
				if err := control(ctx, h.p, r.pod, r.container); err != nil {
					failMu.Lock()
					failures = append(failures, r.pod+"/"+r.container+": "+err.Error())
					failMu.Unlock()
				}
				calls.Add(1)
			}
		}
	})
	before := calls.Load()
	poll(t, "control calls before the rotation", func() bool { return calls.Load() > before+10 })

	if err := h.p.cfg.ControlKeys.Set([]byte("k2"), []byte("k1")); err != nil {
		t.Fatal(err)
	}
	poll(t, "every sandbox re-keyed (gauge 0)", func() bool { return onPrevious(t, h.p) == 0 })
	for _, r := range all {
		switch {
		case d.takes(t, r.addr, ControlToken([]byte("k1"), r.uid)):
			t.Errorf("%s/%s still takes the old key's token", r.pod, r.container)
		case !d.takes(t, r.addr, ControlToken([]byte("k2"), r.uid)):
			t.Errorf("%s/%s does not take the new key's token", r.pod, r.container)
		case !d.takes(t, r.addr, "t"):
			t.Errorf("%s/%s lost the creator's token", r.pod, r.container)
		}
	}
	// The previous key goes; everything stays reachable.
	if err := h.p.cfg.ControlKeys.Set([]byte("k2")); err != nil {
		t.Fatal(err)
	}
	before = calls.Load()
	poll(t, "control calls after the previous key went", func() bool { return calls.Load() > before+2*int64(len(all)) })
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d control calls failed during the rotation, first: %s", len(failures), calls.Load(), failures[0])
	}
	// kubectl logs goes through the same keys (no command: empty logs).
	if _, err := h.p.GetContainerLogs(ctx, "ns", "c", "side", vkapi.ContainerLogOpts{}); err != nil {
		t.Fatalf("logs: %v", err)
	}

	// A new sandbox binds with the new key only.
	pod := testPod("d", "img")
	if err := h.p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	addr := h.wait(t, pod.UID, "d Ready", isReady).Status.PodIP + ":" + strconv.Itoa(daemonapi.Port)
	d.waitUp(t, addr)
	if !d.takes(t, addr, ControlToken([]byte("k2"), string(pod.UID))) || d.takes(t, addr, ControlToken([]byte("k1"), string(pod.UID))) {
		t.Fatal("a sandbox made after the rotation: want the new key's token only")
	}
	if n := onPrevious(t, h.p); n != 0 {
		t.Fatalf("gauge %d at the end", n)
	}
}

// TestRekeyRetriesAndDoneAlready: an unreachable daemon stays counted and
// is re-keyed once it answers; a daemon re-keyed already (refusing the
// previous key, taking the current) and one whose key is not known (as
// after an adoption) are settled without error.
func TestRekeyRetriesAndDoneAlready(t *testing.T) {
	h, d := keyedHarness(t, 4)
	ctx := t.Context()
	addrs := map[string]string{}
	uids := map[string]types.UID{}
	for _, name := range []string{"down", "done", "unknown"} {
		pod := testPod(name, "img")
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		addrs[name] = h.wait(t, pod.UID, name+" Ready", isReady).Status.PodIP + ":" + strconv.Itoa(daemonapi.Port)
		d.waitUp(t, addrs[name])
		uids[name] = pod.UID
	}
	tok := func(key, name string) string { return ControlToken([]byte(key), string(uids[name])) }
	// "done" moves to k2 behind the provider's back (a round cut short).
	hc := &http.Client{Transport: &http.Transport{DialContext: d.dial}}
	defer hc.CloseIdleConnections()
	c, err := client.New(addrs["done"], client.WithHTTPClient(hc), client.WithToken(tok("k1", "done")))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RotateToken(ctx, tokenHash(tok("k2", "done"))); err != nil {
		t.Fatal(err)
	}
	// "unknown": which key it holds is not known.
	h.p.mu.Lock()
	h.p.byUID[string(uids["unknown"])].controlKey = nil
	h.p.mu.Unlock()
	d.setRefused(addrs["down"], true)

	if err := h.p.cfg.ControlKeys.Set([]byte("k2"), []byte("k1")); err != nil {
		t.Fatal(err)
	}
	poll(t, "all but the unreachable sandbox re-keyed", func() bool {
		return onPrevious(t, h.p) == 1 && d.takes(t, addrs["unknown"], tok("k2", "unknown"))
	})
	if !d.takes(t, addrs["done"], tok("k2", "done")) || !d.takes(t, addrs["done"], "t") {
		t.Fatal(`"done" lost a token`)
	}
	h.p.mu.Lock()
	downKey := string(h.p.byUID[string(uids["down"])].controlKey)
	h.p.mu.Unlock()
	if downKey != "k1" {
		t.Fatalf("the unreachable sandbox is recorded on %q, want k1", downKey)
	}
	d.setRefused(addrs["down"], false)
	poll(t, "the sandbox that answers again re-keyed", func() bool { return onPrevious(t, h.p) == 0 })
	if !d.takes(t, addrs["down"], tok("k2", "down")) || d.takes(t, addrs["down"], tok("k1", "down")) {
		t.Fatal(`"down": want the new key's token only`)
	}
}
