//go:build root

package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// TestRootSandboxBandwidth: a pod's kubernetes.io/egress-bandwidth and
// ingress-bandwidth caps hold in both directions, against an uncapped
// sandbox measured in the same run; a later pod in the same slot is
// uncapped again.
func TestRootSandboxBandwidth(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	bridgeIP := strings.TrimSuffix(s.Env["BRIDGE_CIDR"], ".0.0/16") + ".0.1"
	rt := newContainerdRuntime(t, s, 2, 1, func(c *noderuntime.Config) {
		c.EgressAllow, _ = sandboxnet.ParsePrefixes(bridgeIP)
	})
	const size = 2 << 20 // bytes each way
	const capBits = 4_000_000

	// The node's end: a sink that reports how long a sandbox took to send
	// size bytes.
	sink, err := net.Listen("tcp", bridgeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	took := make(chan time.Duration, 1)
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			begin := time.Now()
			n, _ := io.Copy(io.Discard, c)
			c.Close()
			if n >= size {
				took <- time.Since(begin)
			}
		}
	}()

	measure := func(uid string, caps bool) (egress, ingress time.Duration) {
		req := runtimetest.Request(uid, s.DebianImage)
		req.Containers[0].Ports = []runtime.Port{{Port: 8080}}
		if caps {
			req.IngressBandwidth, req.EgressBandwidth = capBits, capBits
		}
		slot, err := rt.Bind(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rt.Release(context.Background(), uid, 0) }()
		framework.Eventually(t, time.Minute, uid+" to be assigned", func(ctx context.Context) (bool, error) {
			_, err := sandboxExec(ctx, slot, runtimetest.Token, "true")
			return err == nil, nil
		})
		c := daemonClient(t, slot)
		// Egress: the sandbox sends to the node's sink.
		send := "import socket; s = socket.create_connection(('" + bridgeIP + "', " + strconv.Itoa(sink.Addr().(*net.TCPAddr).Port) + ")); s.sendall(b'x' * " + strconv.Itoa(size) + "); s.close()"
		if r, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"python3", "-c", send}, TimeoutSeconds: 60}); err != nil || r.ExitCode != 0 {
			t.Fatalf("%s: send: %+v %v", uid, r, err)
		}
		select {
		case egress = <-took:
		case <-time.After(time.Minute):
			t.Fatalf("%s: the sink got nothing", uid)
		}
		// Ingress: the node sends to a server in the sandbox that answers
		// once it has read everything.
		serve := "import socket; l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(('0.0.0.0', 8080)); l.listen()\n" +
			"while True:\n c, _ = l.accept(); n = 0\n while n < " + strconv.Itoa(size) + ":\n  b = c.recv(65536)\n  if not b: break\n  n += len(b)\n c.sendall(b'done\\n'); c.close()"
		if _, err := c.StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-c", serve}}); err != nil {
			t.Fatal(err)
		}
		var conn net.Conn
		framework.Eventually(t, 30*time.Second, uid+"'s server", func(ctx context.Context) (bool, error) {
			conn, err = net.DialTimeout("tcp", slot.IP+":8080", time.Second)
			return err == nil, nil
		})
		defer conn.Close()
		begin := time.Now()
		if _, err := conn.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "done\n" {
			t.Fatalf("%s: the server's answer: %q %v", uid, line, err)
		}
		return egress, time.Since(begin)
	}
	freeOut, freeIn := measure("bw-free", false)
	capOut, capIn := measure("bw-capped", true)
	againOut, _ := measure("bw-free-again", false)
	t.Logf("%d bytes each way: uncapped egress %v ingress %v; capped at %d bit/s egress %v ingress %v; uncapped again egress %v",
		size, freeOut, freeIn, capBits, capOut, capIn, againOut)
	// At 4 Mbit/s, 2 MiB take 4.2 s; the buckets let about 64 KiB through at once.
	floor := time.Duration(float64(size*8)/capBits*float64(time.Second)) * 3 / 4
	if capOut < floor || capIn < floor {
		t.Errorf("capped transfers took %v out and %v in, want at least %v at %d bit/s", capOut, capIn, floor, capBits)
	}
	if freeOut > floor/2 || freeIn > floor/2 || againOut > floor/2 {
		t.Errorf("uncapped transfers took %v out, %v in, %v out after a capped pod: the test cannot tell capped from uncapped", freeOut, freeIn, againOut)
	}
}
