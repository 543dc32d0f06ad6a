//go:build root || e2e

package e2e

import (
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// connectScript tries a TCP connection to each host:port argument and
// prints "host:port ok" or "host:port <error>", one line each.
const connectScript = `
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "ok")
    except Exception as e:
        print(target, type(e).__name__)
`

// publicListener adds public (a "public" address, standing for the
// internet: added after the runtime learnt the node's addresses) to the
// host's loopback and serves HTTP on every address of the host; it returns
// the port. Both go at the test's end.
func publicListener(t *testing.T, public string) string {
	t.Helper()
	if out, err := exec.Command("ip", "addr", "add", public+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add %s to lo: %v %s", public, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", public+"/32", "dev", "lo").Run() })
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})) }()
	t.Cleanup(func() { l.Close() })
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// resolveScript resolves each name argument (IPv4) and prints "name
// address" or "name <error>", one line each.
const resolveScript = `
import socket, sys
for name in sys.argv[1:]:
    try:
        print(name, socket.gethostbyname(name))
    except Exception as e:
        print(name, type(e).__name__)
`

// testDNS is a DNS server in the test process answering A queries from
// a map (TTL 1 s), NXDOMAIN for other names; it returns its address.
type testDNS struct {
	mu    sync.Mutex
	names map[string]string
}

func (d *testDNS) set(name, addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.names[name] = addr
}

func (d *testDNS) serve(t *testing.T, addr string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			m.Response, m.RecursionAvailable = true, true
			q := m.Questions[0]
			d.mu.Lock()
			a, ok := d.names[strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")]
			d.mu.Unlock()
			switch {
			case !ok:
				m.RCode = dnsmessage.RCodeNameError
			case q.Type == dnsmessage.TypeA:
				m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1},
					Body: &dnsmessage.AResource{A: netip.MustParseAddr(a).As4()}}}
			}
			if b, err := m.Pack(); err == nil {
				_, _ = pc.WriteTo(b, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}
