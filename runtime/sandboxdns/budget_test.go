package sandboxdns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/dns/dnsmessage"
)

// Two sandboxes of the served tests, both on loopback (all of 127/8 is
// the host's), so each has its own source address.
var (
	loudIP  = netip.MustParseAddr("127.0.0.2")
	quietIP = netip.MustParseAddr("127.0.0.3")
)

// fakeClock is a Config.Now that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newTestServer is New on a loopback port, its sockets closed when the
// test ends.
func newTestServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.udp.Close()
		s.tcp.Close()
	})
	return s
}

// serve runs s until the test ends (and checks Run then returns); it
// returns the address s serves on.
func serve(t *testing.T, s *Server) *net.UDPAddr {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(s.Port())}
}

func register(t *testing.T, s *Server, src netip.Addr, p *pins, names ...string) {
	t.Helper()
	if err := s.Register(src, names, p.pin); err != nil {
		t.Fatal(err)
	}
}

// queryEDNS is query with an OPT record, so answers may carry an
// Extended DNS Error.
func queryEDNS(t *testing.T, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
		t.Fatal(err)
	}
	b, err := (&dnsmessage.Message{Header: dnsmessage.Header{ID: 4242, RecursionDesired: true},
		Questions:   []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}},
		Additionals: []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}}}).Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func unpack(t *testing.T, b []byte) dnsmessage.Message {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		t.Fatalf("answer: %v", err)
	}
	return m
}

// edeOf is the text of m's Extended DNS Error ("" for none).
func edeOf(m dnsmessage.Message) string {
	for _, r := range m.Additionals {
		opt, ok := r.Body.(*dnsmessage.OPTResource)
		if !ok {
			continue
		}
		for _, o := range opt.Options {
			if o.Code == 15 && len(o.Data) >= 2 {
				return string(o.Data[2:])
			}
		}
	}
	return ""
}

func addrsOf(m dnsmessage.Message) []string {
	var got []string
	for _, r := range m.Answers {
		if ar, ok := r.Body.(*dnsmessage.AResource); ok {
			got = append(got, netip.AddrFrom4(ar.A).String())
		}
	}
	return got
}

func (p *pins) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, a := range p.addrs {
		out = append(out, a.String())
	}
	return out
}

// udpFrom is a UDP socket from src to the server at to.
func udpFrom(t *testing.T, src netip.Addr, to *net.UDPAddr) *net.UDPConn {
	t.Helper()
	c, err := net.DialUDP("udp4", &net.UDPAddr{IP: src.AsSlice()}, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// askUDP sends q on c until an answer comes back or within is over, as a
// stub resolver retries: each try waits a fraction of within.
func askUDP(t *testing.T, c *net.UDPConn, q []byte, within time.Duration) (dnsmessage.Message, error) {
	t.Helper()
	end := time.Now().Add(within)
	buf := make([]byte, 65535)
	for time.Now().Before(end) {
		if _, err := c.Write(q); err != nil {
			return dnsmessage.Message{}, err
		}
		try := time.Now().Add(within / 10)
		if try.After(end) {
			try = end
		}
		_ = c.SetReadDeadline(try)
		n, err := c.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return dnsmessage.Message{}, err
		}
		return unpack(t, buf[:n]), nil
	}
	return dnsmessage.Message{}, fmt.Errorf("no answer within %v", within)
}

// tcpFrom is a TCP connection from src to the server at to.
func tcpFrom(t *testing.T, src netip.Addr, to *net.UDPAddr) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp4", to.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func askTCP(t *testing.T, c net.Conn, q []byte) (dnsmessage.Message, error) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		return dnsmessage.Message{}, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return dnsmessage.Message{}, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return dnsmessage.Message{}, err
	}
	return unpack(t, b), nil
}

// TestSandboxInFlight: a sandbox whose name server never answers fills
// only its own share of the queries in flight; the rest of its queries
// are refused at once, saying why, and another sandbox's lookups are
// answered promptly.
func TestSandboxInFlight(t *testing.T) {
	up := newUpstream(t)
	up.set("fast.test.", a("fast.test.", 60, "203.0.113.1"))
	up.hang("slow.test.")
	s := newTestServer(t, Config{Upstreams: []string{up.addr}, Timeout: time.Minute, MaxInFlight: 8, MaxInFlightPerSandbox: 2})
	register(t, s, loudIP, &pins{}, "slow.test", "fast.test")
	register(t, s, quietIP, &pins{}, "fast.test")
	addr := serve(t, s)

	loud := udpFrom(t, loudIP, addr)
	const sent = 20
	for range sent {
		if _, err := loud.Write(queryEDNS(t, "slow.test.", dnsmessage.TypeA)); err != nil {
			t.Fatal(err)
		}
	}
	// Sent after all of loud's, so read after them from the one socket.
	m, err := askUDP(t, udpFrom(t, quietIP, addr), query(t, "fast.test.", dnsmessage.TypeA), 5*time.Second)
	if err != nil {
		t.Fatalf("the other sandbox: %v: its lookup waits on the slow one's", err)
	}
	if got := addrsOf(m); m.RCode != dnsmessage.RCodeSuccess || !slices.Equal(got, []string{"203.0.113.1"}) {
		t.Errorf("the other sandbox: %v %v, want its address", m.RCode, got)
	}

	const refused = sent - 2
	buf := make([]byte, 4096)
	_ = loud.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range refused {
		n, err := loud.Read(buf)
		if err != nil {
			t.Fatalf("the slow sandbox's queries past its budget: %d answered, want %d: %v", i, refused, err)
		}
		m := unpack(t, buf[:n])
		if m.RCode != dnsmessage.RCodeRefused || !strings.Contains(edeOf(m), "in flight") {
			t.Fatalf("past the budget: %v %q, want REFUSED saying too many in flight", m.RCode, edeOf(m))
		}
	}
	if n := testutil.ToFloat64(s.metrics.refused.WithLabelValues(reasonInFlight)); n != refused {
		t.Errorf("refused for in flight: %v, want %d", n, refused)
	}
}

// TestSandboxConns: a sandbox holding its TCP connections open gets no
// more; another sandbox still connects and is answered.
func TestSandboxConns(t *testing.T) {
	up := newUpstream(t)
	up.set("fast.test.", a("fast.test.", 60, "203.0.113.1"))
	s := newTestServer(t, Config{Upstreams: []string{up.addr}, MaxConns: 4, MaxConnsPerSandbox: 2})
	register(t, s, loudIP, &pins{}, "fast.test")
	register(t, s, quietIP, &pins{}, "fast.test")
	addr := serve(t, s)

	var loud []net.Conn
	for range 4 {
		loud = append(loud, tcpFrom(t, loudIP, addr))
	}
	// Connected after all of loud's, so accepted after them.
	quiet := tcpFrom(t, quietIP, addr)
	if m, err := askTCP(t, quiet, query(t, "fast.test.", dnsmessage.TypeA)); err != nil || m.RCode != dnsmessage.RCodeSuccess {
		t.Errorf("the other sandbox over TCP: %v %v, want an answer", m.RCode, err)
	}
	for i, c := range loud[2:] {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("the sandbox's connection %d past its budget: %v, want it closed", i+3, err)
		}
	}
	if m, err := askTCP(t, loud[0], query(t, "fast.test.", dnsmessage.TypeA)); err != nil || m.RCode != dnsmessage.RCodeSuccess {
		t.Errorf("the sandbox's first connection: %v %v, want an answer", m.RCode, err)
	}
	if n := testutil.ToFloat64(s.metrics.connsRejected.WithLabelValues(limitSandbox)); n != 2 {
		t.Errorf("connections rejected for the sandbox's budget: %v, want 2", n)
	}
}

// TestAnswerAddrCap: of an answer with 500 addresses, the first
// MaxAnswerAddrs are pinned and only they are answered; the answer then
// fits in a plain UDP message.
func TestAnswerAddrCap(t *testing.T) {
	up := newUpstream(t)
	var rr []dnsmessage.Resource
	var first []string
	for i := range 500 {
		addr := fmt.Sprintf("10.1.%d.%d", i/256, i%256)
		rr = append(rr, a("many.test.", 300, addr))
		if i < 16 {
			first = append(first, addr)
		}
	}
	up.set("many.test.", rr...)
	s := newTestServer(t, Config{Upstreams: []string{up.addr}})
	for _, udp := range []bool{false, true} {
		t.Run(fmt.Sprintf("udp=%v", udp), func(t *testing.T) {
			p := &pins{}
			register(t, s, sandboxIP, p, "many.test")
			m := unpack(t, s.Answer(t.Context(), sandboxIP, query(t, "many.test.", dnsmessage.TypeA), udp))
			if m.RCode != dnsmessage.RCodeSuccess || m.Truncated {
				t.Errorf("rcode %v, truncated %v: want an answer that fits", m.RCode, m.Truncated)
			}
			if got := addrsOf(m); !slices.Equal(got, first) {
				t.Errorf("answered %d addresses, want the first 16 of 500", len(got))
			}
			if got := p.list(); !slices.Equal(got, first) {
				t.Errorf("pinned %d addresses, want the first 16 of 500", len(got))
			}
		})
	}
	if n := testutil.ToFloat64(s.metrics.addrsDropped); n != 2*(500-16) {
		t.Errorf("addresses left out: %v, want %d", n, 2*(500-16))
	}
}

// TestPinnedCap: a sandbox with MaxPinnedAddrs addresses pinned is
// refused answers that would pin more, saying why, until pins lapse; it
// still resolves names whose addresses it has, and another sandbox has
// its own budget.
func TestPinnedCap(t *testing.T) {
	up := newUpstream(t)
	up.set("one.test.", a("one.test.", 60, "198.51.100.1"), a("one.test.", 60, "198.51.100.2"), a("one.test.", 60, "198.51.100.3"))
	up.set("two.test.", a("two.test.", 60, "198.51.100.4"), a("two.test.", 60, "198.51.100.5"), a("two.test.", 60, "198.51.100.6"))
	clock := newFakeClock()
	s := newTestServer(t, Config{Upstreams: []string{up.addr}, MaxAnswerAddrs: 3, MaxPinnedAddrs: 4, Now: clock.Now})
	p, other := &pins{}, &pins{}
	register(t, s, sandboxIP, p, "one.test", "two.test")
	register(t, s, strangerIP, other, "two.test")

	for _, step := range []struct {
		name    string
		src     netip.Addr
		q       string
		advance time.Duration
		rcode   dnsmessage.RCode
		ede     string // in the answer's Extended DNS Error
		pinned  int    // the sandbox's pins after the step
	}{
		{name: "within the budget", src: sandboxIP, q: "one.test.", pinned: 3},
		{name: "past the budget", src: sandboxIP, q: "two.test.", rcode: dnsmessage.RCodeRefused, ede: "pinned", pinned: 3},
		{name: "addresses it has", src: sandboxIP, q: "one.test.", pinned: 6},
		{name: "another sandbox", src: strangerIP, q: "two.test."},
		{name: "after the pins lapse", src: sandboxIP, q: "two.test.", advance: 71 * time.Second, pinned: 9},
	} {
		clock.advance(step.advance)
		m := unpack(t, s.Answer(t.Context(), step.src, queryEDNS(t, step.q, dnsmessage.TypeA), true))
		if m.RCode != step.rcode || !strings.Contains(edeOf(m), step.ede) {
			t.Errorf("%s: %v %q, want %v %q", step.name, m.RCode, edeOf(m), step.rcode, step.ede)
		}
		if step.rcode != dnsmessage.RCodeSuccess && len(m.Answers) > 0 {
			t.Errorf("%s: answered %v, want nothing unpinned", step.name, addrsOf(m))
		}
		if step.src == sandboxIP && len(p.list()) != step.pinned {
			t.Errorf("%s: pinned %v, want %d pins", step.name, p.list(), step.pinned)
		}
	}
	if got := other.list(); len(got) != 3 {
		t.Errorf("the other sandbox pinned %v, want two.test's 3", got)
	}
	if n := testutil.ToFloat64(s.metrics.refused.WithLabelValues(reasonPinned)); n != 1 {
		t.Errorf("refused for pinned addresses: %v, want 1", n)
	}
}

// TestQueryRate: a sandbox past its burst is refused, saying why, without
// the upstream asked, until its bucket refills; another sandbox has its
// own bucket.
func TestQueryRate(t *testing.T) {
	up := newUpstream(t)
	up.set("allowed.test.", a("allowed.test.", 60, "203.0.113.80"))
	clock := newFakeClock()
	s := newTestServer(t, Config{Upstreams: []string{up.addr}, QueryRate: 1, QueryBurst: 3, Now: clock.Now})
	register(t, s, sandboxIP, &pins{}, "allowed.test")
	register(t, s, strangerIP, &pins{}, "allowed.test")

	for _, step := range []struct {
		name    string
		src     netip.Addr
		advance time.Duration
		rcode   dnsmessage.RCode
		ede     string
	}{
		{name: "1 of the burst", src: sandboxIP},
		{name: "2 of the burst", src: sandboxIP},
		{name: "3 of the burst", src: sandboxIP},
		{name: "past the burst", src: sandboxIP, rcode: dnsmessage.RCodeRefused, ede: "rate"},
		{name: "another sandbox", src: strangerIP},
		{name: "a second later", src: sandboxIP, advance: time.Second},
		{name: "past the refill", src: sandboxIP, rcode: dnsmessage.RCodeRefused, ede: "rate"},
	} {
		clock.advance(step.advance)
		asked := up.asked.Load()
		m := unpack(t, s.Answer(t.Context(), step.src, queryEDNS(t, "allowed.test.", dnsmessage.TypeA), true))
		if m.RCode != step.rcode || !strings.Contains(edeOf(m), step.ede) {
			t.Errorf("%s: %v %q, want %v %q", step.name, m.RCode, edeOf(m), step.rcode, step.ede)
		}
		if step.rcode == dnsmessage.RCodeRefused && up.asked.Load() != asked {
			t.Errorf("%s: the upstream was asked", step.name)
		}
	}
	if n := testutil.ToFloat64(s.metrics.refused.WithLabelValues(reasonRate)); n != 2 {
		t.Errorf("refused for rate: %v, want 2", n)
	}
}
