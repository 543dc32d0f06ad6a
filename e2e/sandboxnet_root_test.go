//go:build root

package e2e

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
	"github.com/sandman-dev/sandman/runtime/sandboxdns"
)

// connectFrom runs connectScript in slot against targets and returns each
// target's result ("ok" or the error's name). Refused connections must fail
// at once: a dropped one would take the script's 3 s timeout per target.
func connectFrom(t *testing.T, slot runtime.Slot, targets ...string) map[string]string {
	t.Helper()
	begin := time.Now()
	out, err := sandboxExec(t.Context(), slot, runtimetest.Token, append([]string{"python3", "-c", connectScript}, targets...)...)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > time.Duration(len(targets))*2*time.Second {
		t.Errorf("connections took %v: refused connections should fail at once", d)
	}
	got := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = v
	}
	t.Logf("from %s: %v", slot.IP, got)
	return got
}

// checkInbound: the node reaches ip's open port and not its closed one.
func checkInbound(t *testing.T, ip, open, closed string) {
	t.Helper()
	if c, err := net.DialTimeout("tcp", ip+":"+open, 3*time.Second); err != nil {
		t.Errorf("the node cannot reach %s's declared port %s: %v", ip, open, err)
	} else {
		c.Close()
	}
	if c, err := net.DialTimeout("tcp", ip+":"+closed, 3*time.Second); err == nil {
		c.Close()
		t.Errorf("the node reached %s's undeclared port %s", ip, closed)
	}
}

// TestRootSandboxFirewall: a sandbox reaches nothing by default — not
// another sandbox (its daemon or a port it serves), not the node (bridge
// and primary addresses), not metadata — and fails fast; a pool with
// internet egress lets it reach public addresses, and a pod's egress list
// narrows that. A pod's denied ranges (sandman.io/egress-deny) win over the
// pool's exceptions, and a pod with no egress (sandman.io/egress: none)
// reaches nothing, the exceptions included, though it still serves. Inbound,
// the node reaches the daemon and the pod's declared port, and nothing else.
func TestRootSandboxFirewall(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	// allowed is the pool's exception (--sandbox-egress-allow).
	const public, allowed = "203.0.113.77", "203.0.113.78"
	rt := newContainerdRuntime(t, s, 8, 3, func(c *noderuntime.Config) {
		c.EgressInternet = true
		c.EgressAllow = []netip.Prefix{netip.MustParsePrefix(allowed + "/32")}
	})
	port := publicListener(t, public)
	allowedPort := publicListener(t, allowed)
	bridgeIP := strings.TrimSuffix(s.Env["BRIDGE_CIDR"], ".0.0/16") + ".0.1"
	primary := primaryAddr(t)

	bind := func(uid string, mutate func(*runtime.BindRequest)) runtime.Slot {
		req := runtimetest.Request(uid, s.DebianImage)
		if mutate != nil {
			mutate(&req)
		}
		slot, err := rt.Bind(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Release(context.Background(), uid, 0) })
		framework.Eventually(t, time.Minute, uid+" to be assigned", func(ctx context.Context) (bool, error) {
			_, err := sandboxExec(ctx, slot, runtimetest.Token, "true")
			return err == nil, nil
		})
		return slot
	}
	connect := func(slot runtime.Slot, targets ...string) map[string]string {
		t.Helper()
		return connectFrom(t, slot, targets...)
	}

	// B serves on a declared port and on one it did not declare.
	b := bind("fw-b", func(r *runtime.BindRequest) {
		r.Containers[0].Ports = []runtime.Port{{Port: 8080}}
	})
	for _, p := range []string{"8080", "9090"} {
		if _, err := daemonClient(t, b).StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-m", "http.server", p}}); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, 30*time.Second, "B's servers", func(ctx context.Context) (bool, error) {
		out, err := sandboxExec(ctx, b, runtimetest.Token, "python3", "-c", connectScript, "127.0.0.1:8080", "127.0.0.1:9090")
		return err == nil && strings.Count(out, " ok") == 2, nil
	})
	a := bind("fw-a", nil)

	got := connect(a, b.IP+":49983", b.IP+":8080", bridgeIP+":"+port, primary+":"+port, "169.254.169.254:80", public+":"+port)
	for _, target := range []string{b.IP + ":49983", b.IP + ":8080", bridgeIP + ":" + port, primary + ":" + port, "169.254.169.254:80"} {
		if got[target] == "ok" || got[target] == "" {
			t.Errorf("sandbox A reached %s: %q", target, got[target])
		}
	}
	if got[public+":"+port] != "ok" {
		t.Errorf("with internet egress, sandbox A could not reach a public address %s: %q", public, got[public+":"+port])
	}

	// Inbound from the node: the declared port answers, the other does not.
	checkInbound(t, b.IP, "8080", "9090")

	// A pod's egress list narrows the pool's internet egress.
	narrow := bind("fw-narrow", func(r *runtime.BindRequest) { r.Egress = []string{"198.51.100.0/24"} })
	if got := connect(narrow, public+":"+port); got[public+":"+port] == "ok" {
		t.Errorf("a pod whose egress is 198.51.100.0/24 reached %s", public)
	}
	wide := bind("fw-listed", func(r *runtime.BindRequest) { r.Egress = []string{public + "/32", "10.0.0.0/8"} })
	got = connect(wide, public+":"+port, bridgeIP+":"+port)
	if got[public+":"+port] != "ok" {
		t.Errorf("a pod whose egress lists %s could not reach it: %q", public, got[public+":"+port])
	}
	if got[bridgeIP+":"+port] == "ok" {
		t.Errorf("a pod's egress list widened the pool's: it reached the node at %s", bridgeIP)
	}

	// A pod's denied ranges win over the pool's exceptions and leave the
	// rest of its egress.
	denied := bind("fw-denied", func(r *runtime.BindRequest) { r.EgressDeny = []string{allowed + "/32"} })
	got = connect(denied, public+":"+port, allowed+":"+allowedPort)
	if got[public+":"+port] != "ok" {
		t.Errorf("a pod that denies only %s could not reach %s: %q", allowed, public, got[public+":"+port])
	}
	if got[allowed+":"+allowedPort] == "ok" || got[allowed+":"+allowedPort] == "" {
		t.Errorf("a pod that denies the pool's exception %s reached it: %q", allowed, got[allowed+":"+allowedPort])
	}

	// No egress (sandman.io/egress: none, as the virtual node sends it):
	// nothing, the pool's exception included; the node still reaches the
	// sandbox (the bind's readiness and connect's exec went through it).
	none := bind("fw-none", func(r *runtime.BindRequest) {
		r.EgressDeny = []string{"0.0.0.0/0"}
		r.Containers[0].Ports = []runtime.Port{{Port: 8080}}
	})
	got = connect(none, public+":"+port, allowed+":"+allowedPort, "127.0.0.1:49983")
	for _, target := range []string{public + ":" + port, allowed + ":" + allowedPort} {
		if got[target] == "ok" || got[target] == "" {
			t.Errorf("a pod with no egress reached %s: %q", target, got[target])
		}
	}
	if got["127.0.0.1:49983"] != "ok" {
		t.Errorf("a pod with no egress could not reach its own daemon over the loopback: %q", got["127.0.0.1:49983"])
	}
	if _, err := daemonClient(t, none).StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-m", "http.server", "8080"}}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the server of the pod with no egress", func(ctx context.Context) (bool, error) {
		c, err := net.DialTimeout("tcp", none.IP+":8080", time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil, nil
	})
}

// askScript sends a DNS query for argv[2] (type A) to argv[1]:53 over UDP
// and prints the answer's rcode, or the error's name.
const askScript = `
import socket, struct, sys
server, name = sys.argv[1], sys.argv[2]
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
try:
    s.sendto(q, (server, 53))
    r = s.recv(4096)
    print("rcode", r[3] & 15)
except Exception as e:
    print(type(e).__name__)
`

// costScript times argv[2] connections to argv[1] (host:port, a name
// resolved afresh each time, or an address) and prints the p50 in ms.
const costScript = `
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    socket.create_connection((host, int(port)), timeout=3).close()
    times.append((time.perf_counter() - t) * 1000)
times.sort()
print("p50 %.3f" % times[len(times) // 2])
`

// TestRootSandboxDomains: a pod that allows a name (sandman.io/egress-
// domains) resolves it through the node's resolver, whatever server it
// asks, reaches what it resolves to and no other public address, cannot
// resolve other names (REFUSED, even from a server of its choosing that
// would answer), and follows the name when its address changes. It logs
// the cost: the p50 of a connection to the name (resolved each time) vs
// to an address on a pod's egress list.
func TestRootSandboxDomains(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	const first, second, never = "203.0.113.80", "203.0.113.81", "203.0.113.82"
	upstream := &testDNS{names: map[string]string{"allowed.test": first, "other.test": never}}
	upAddr := upstream.serve(t, "127.0.0.1:0")
	resolver, err := sandboxdns.New(sandboxdns.Config{Upstreams: []string{upAddr}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	resolved := make(chan error, 1)
	go func() { resolved <- resolver.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-resolved; err != nil {
			t.Errorf("resolver: %v", err)
		}
	})
	rt := newContainerdRuntime(t, s, 4, 2, func(c *noderuntime.Config) {
		c.EgressInternet = true
		c.DNS = resolver
	})
	ports := map[string]string{}
	for _, a := range []string{first, second, never} {
		ports[a] = publicListener(t, a)
	}
	// A server of the sandbox's choosing, on a public address, that would
	// say other.test is the never-resolved address.
	rogue := &testDNS{names: map[string]string{"other.test": never}}
	rogue.serve(t, never+":53")

	bind := func(uid string, mutate func(*runtime.BindRequest)) runtime.Slot {
		req := runtimetest.Request(uid, s.DebianImage)
		mutate(&req)
		slot, err := rt.Bind(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Release(context.Background(), uid, 0) })
		framework.Eventually(t, time.Minute, uid+" to be assigned", func(ctx context.Context) (bool, error) {
			_, err := sandboxExec(ctx, slot, runtimetest.Token, "true")
			return err == nil, nil
		})
		return slot
	}
	run := func(slot runtime.Slot, script string, args ...string) map[string]string {
		t.Helper()
		out, err := sandboxExec(ctx, slot, runtimetest.Token, append([]string{"python3", "-c", script}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(line, " ")
			got[k] = v
		}
		return got
	}

	named := bind("dns-named", func(r *runtime.BindRequest) { r.EgressDomains = []string{"allowed.test"} })
	if out, err := sandboxExec(ctx, named, runtimetest.Token, "cat", "/etc/resolv.conf"); err == nil {
		t.Logf("the image's resolv.conf: %q", out)
	}
	got := run(named, resolveScript, "allowed.test", "other.test")
	t.Logf("resolved: %v", got)
	if got["allowed.test"] != first {
		t.Errorf("allowed.test resolved to %q, want %s", got["allowed.test"], first)
	}
	if got["other.test"] != "gaierror" {
		t.Errorf("other.test, not allowed, resolved to %q, want an error", got["other.test"])
	}
	got = connectFrom(t, named, "allowed.test:"+ports[first], never+":"+ports[never])
	if got["allowed.test:"+ports[first]] != "ok" {
		t.Errorf("a pod that allows allowed.test could not reach it: %q", got["allowed.test:"+ports[first]])
	}
	if got[never+":"+ports[never]] == "ok" || got[never+":"+ports[never]] == "" {
		t.Errorf("a pod that allows only allowed.test reached %s, which nothing resolved to: %q", never, got[never+":"+ports[never]])
	}
	// Asking another server goes to the node's resolver all the same: one
	// on a public address that would answer, or the loopback (what an
	// image without a nameserver asks).
	if got := run(named, askScript, never, "other.test"); got["rcode"] != "5" {
		t.Errorf("a query for other.test sent to %s:53 got %v, want the node resolver's REFUSED (rcode 5)", never, got)
	}
	if got := run(named, askScript, "127.0.0.1", "allowed.test"); got["rcode"] != "0" {
		t.Errorf("a query for allowed.test sent to 127.0.0.1:53 got %v, want the node resolver's answer (rcode 0)", got)
	}

	// The name moves: once the sandbox resolves it again (its TTL is 1 s),
	// the new address is reachable.
	upstream.set("allowed.test", second)
	framework.Eventually(t, 30*time.Second, "allowed.test to resolve to "+second, func(ctx context.Context) (bool, error) {
		return run(named, resolveScript, "allowed.test")["allowed.test"] == second, nil
	})
	if got := connectFrom(t, named, "allowed.test:"+ports[second]); got["allowed.test:"+ports[second]] != "ok" {
		t.Errorf("after allowed.test moved to %s the pod could not reach it: %q", second, got["allowed.test:"+ports[second]])
	}

	// The cost of a name: a connection that resolves it first, vs one to
	// an address on the pod's egress list.
	listed := bind("dns-listed", func(r *runtime.BindRequest) { r.Egress = []string{second + "/32"} })
	const tries = "20"
	byName := run(named, costScript, "allowed.test:"+ports[second], tries)
	byAddr := run(listed, costScript, second+":"+ports[second], tries)
	t.Logf("connection p50 over %s tries: to allowed.test (resolved each time) %s ms, to %s on the egress list %s ms", tries, byName["p50"], second, byAddr["p50"])
}
