package sandboxdns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// upstream is a DNS server in the test process: it answers the records
// of records whose owner is the question's name (every record of the
// name's entry, whatever its owner, so a test can slip in others),
// NXDOMAIN for names it does not have, and nothing at all for the names
// it was told to hang on.
type upstream struct {
	mu      sync.Mutex
	records map[string][]dnsmessage.Resource
	hangs   map[string]bool
	asked   atomic.Int32
	addr    string
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{records: map[string][]dnsmessage.Resource{}, hangs: map[string]bool{}}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	u.addr = pc.LocalAddr().String()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if b := u.reply(buf[:n]); b != nil {
				_, _ = pc.WriteTo(b, from)
			}
		}
	}()
	return u
}

func (u *upstream) set(name string, rr ...dnsmessage.Resource) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.records[name] = rr
}

// hang makes the upstream never answer name.
func (u *upstream) hang(name string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.hangs[name] = true
}

func (u *upstream) reply(query []byte) []byte {
	u.asked.Add(1)
	var m dnsmessage.Message
	if err := m.Unpack(query); err != nil {
		return nil
	}
	m.Response = true
	u.mu.Lock()
	name := strings.ToLower(m.Questions[0].Name.String())
	rr, ok := u.records[name]
	hang := u.hangs[name]
	u.mu.Unlock()
	if hang {
		return nil
	}
	if !ok {
		m.RCode = dnsmessage.RCodeNameError
	}
	for _, r := range rr {
		if r.Header.Type == m.Questions[0].Type || r.Header.Type == dnsmessage.TypeCNAME || r.Header.Type == dnsmessage.TypeA {
			m.Answers = append(m.Answers, r)
		}
	}
	b, _ := m.Pack()
	return b
}

func a(owner string, ttl uint32, addr string) dnsmessage.Resource {
	return dnsmessage.Resource{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(owner), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: ttl},
		Body: &dnsmessage.AResource{A: netip.MustParseAddr(addr).As4()}}
}

func cname(owner string, ttl uint32, target string) dnsmessage.Resource {
	return dnsmessage.Resource{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(owner), Type: dnsmessage.TypeCNAME, Class: dnsmessage.ClassINET, TTL: ttl},
		Body: &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(target)}}
}

// pins records what a sandbox's Pinner was given; err fails it.
type pins struct {
	mu    sync.Mutex
	addrs []netip.Addr
	ttls  []time.Duration
	err   error
}

func (p *pins) pin(addrs []netip.Addr, ttl time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	p.addrs = append(p.addrs, addrs...)
	p.ttls = append(p.ttls, ttl)
	return nil
}

func query(t *testing.T, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b, err := (&dnsmessage.Message{Header: dnsmessage.Header{ID: 4242, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}}}).Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	sandboxIP  = netip.MustParseAddr("10.88.0.5")
	strangerIP = netip.MustParseAddr("10.88.0.6")
)

// TestAnswer: a registered sandbox resolves its allowed names (exact, or
// under a wildcard, not the wildcard's apex) and nothing else (REFUSED,
// the upstream not asked); the addresses of an A answer are pinned before
// it is returned, for the chain's TTL clamped to [MinTTL, MaxTTL] plus
// the slack, following CNAMEs from the allowed name only; AAAA is answered
// empty; an address no sandbox has is refused; upstream errors and pin
// failures are SERVFAIL with nothing pinned.
func TestAnswer(t *testing.T) {
	up := newUpstream(t)
	up.set("allowed.test.", a("allowed.test.", 1, "203.0.113.80"))
	up.set("api.example.com.", a("api.example.com.", 86400, "198.51.100.1"))
	up.set("deep.sub.example.com.", a("deep.sub.example.com.", 300, "198.51.100.2"))
	up.set("example.com.", a("example.com.", 300, "198.51.100.3"))
	up.set("www.cdn.test.", cname("www.cdn.test.", 600, "edge.provider.net."), cname("edge.provider.net.", 120, "e1.provider.net."),
		a("e1.provider.net.", 60, "198.51.100.9"), a("other.test.", 60, "203.0.113.66"))
	up.set("sneaky.test.", cname("sneaky.test.", 60, "x.provider.net."), a("allowed.test.", 60, "203.0.113.99"))
	up.set("other.test.", a("other.test.", 60, "203.0.113.82"))

	const slack = 10 * time.Second
	for _, tc := range []struct {
		name       string
		src        netip.Addr
		q          string
		typ        dnsmessage.Type
		pinErr     error
		upstream   string // "": the fake
		rcode      dnsmessage.RCode
		answers    []string // A addresses answered
		pinned     []string
		pinTTL     time.Duration
		answerTTL  uint32 // of the last record answered
		noUpstream bool   // the upstream must not be asked
	}{
		{name: "exact", src: sandboxIP, q: "allowed.test.", typ: dnsmessage.TypeA,
			answers: []string{"203.0.113.80"}, pinned: []string{"203.0.113.80"}, pinTTL: 30*time.Second + slack, answerTTL: 1},
		{name: "any case", src: sandboxIP, q: "ALLOWED.Test.", typ: dnsmessage.TypeA,
			answers: []string{"203.0.113.80"}, pinned: []string{"203.0.113.80"}, pinTTL: 30*time.Second + slack, answerTTL: 1},
		{name: "a long TTL clamped", src: sandboxIP, q: "api.example.com.", typ: dnsmessage.TypeA,
			answers: []string{"198.51.100.1"}, pinned: []string{"198.51.100.1"}, pinTTL: time.Hour + slack, answerTTL: 3600},
		{name: "under a wildcard", src: sandboxIP, q: "deep.sub.example.com.", typ: dnsmessage.TypeA,
			answers: []string{"198.51.100.2"}, pinned: []string{"198.51.100.2"}, pinTTL: 300*time.Second + slack, answerTTL: 300},
		{name: "a wildcard's apex", src: sandboxIP, q: "example.com.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeRefused, noUpstream: true},
		{name: "not allowed", src: sandboxIP, q: "other.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeRefused, noUpstream: true},
		{name: "a suffix that is not a label", src: sandboxIP, q: "notallowed.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeRefused, noUpstream: true},
		{name: "CNAMEs from an allowed name", src: sandboxIP, q: "www.cdn.test.", typ: dnsmessage.TypeA,
			answers: []string{"198.51.100.9"}, pinned: []string{"198.51.100.9"}, pinTTL: 60*time.Second + slack, answerTTL: 60},
		{name: "an A record off the chain", src: sandboxIP, q: "sneaky.test.", typ: dnsmessage.TypeA},
		{name: "AAAA", src: sandboxIP, q: "allowed.test.", typ: dnsmessage.TypeAAAA, noUpstream: true},
		{name: "no such name", src: sandboxIP, q: "missing.example.com.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeNameError},
		{name: "unknown source", src: strangerIP, q: "allowed.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeRefused, noUpstream: true},
		{name: "pin fails", src: sandboxIP, q: "allowed.test.", typ: dnsmessage.TypeA, pinErr: errors.New("no set"), rcode: dnsmessage.RCodeServerFailure},
		{name: "upstream down", src: sandboxIP, q: "allowed.test.", typ: dnsmessage.TypeA, upstream: closedPort(t), rcode: dnsmessage.RCodeServerFailure, noUpstream: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ups := []string{up.addr}
			if tc.upstream != "" {
				ups = []string{tc.upstream}
			}
			s, err := New(Config{Listen: "127.0.0.1:0", Upstreams: ups, Timeout: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer s.udp.Close()
			defer s.tcp.Close()
			p := &pins{err: tc.pinErr}
			if err := s.Register(sandboxIP, []string{"allowed.test", "*.example.com", "www.cdn.test", "sneaky.test"}, p.pin); err != nil {
				t.Fatal(err)
			}
			asked := up.asked.Load()
			resp := s.Answer(t.Context(), tc.src, query(t, tc.q, tc.typ), true)
			var m dnsmessage.Message
			if err := m.Unpack(resp); err != nil {
				t.Fatalf("answer: %v", err)
			}
			if m.ID != 4242 || !m.Response || len(m.Questions) != 1 {
				t.Errorf("answer header %+v, questions %v: want the query's ID, a response, its question", m.Header, m.Questions)
			}
			if m.RCode != tc.rcode {
				t.Errorf("rcode %v, want %v", m.RCode, tc.rcode)
			}
			var got []string
			var lastTTL uint32
			for _, r := range m.Answers {
				lastTTL = r.Header.TTL
				if ar, ok := r.Body.(*dnsmessage.AResource); ok {
					got = append(got, netip.AddrFrom4(ar.A).String())
				}
			}
			if !slices.Equal(got, tc.answers) {
				t.Errorf("answered %v, want %v", got, tc.answers)
			}
			if len(tc.answers) > 0 && lastTTL != tc.answerTTL {
				t.Errorf("answered TTL %d, want %d", lastTTL, tc.answerTTL)
			}
			var pinned []string
			for _, a := range p.addrs {
				pinned = append(pinned, a.String())
			}
			if !slices.Equal(pinned, tc.pinned) {
				t.Errorf("pinned %v, want %v", pinned, tc.pinned)
			}
			if tc.pinTTL != 0 && (len(p.ttls) != 1 || p.ttls[0] != tc.pinTTL) {
				t.Errorf("pinned for %v, want %v", p.ttls, tc.pinTTL)
			}
			if tc.noUpstream && up.asked.Load() != asked {
				t.Errorf("the upstream was asked")
			}
		})
	}
}

// closedPort is a UDP address nothing listens on.
func closedPort(t *testing.T) string {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	return addr
}

// TestServe: the server answers over UDP and TCP on one port, a query
// from an address it forgot is refused, and Run returns when its context
// ends.
func TestServe(t *testing.T) {
	up := newUpstream(t)
	up.set("allowed.test.", a("allowed.test.", 5, "203.0.113.80"))
	s, err := New(Config{Listen: "127.0.0.1:0", Upstreams: []string{up.addr}})
	if err != nil {
		t.Fatal(err)
	}
	p := &pins{}
	if err := s.Register(netip.MustParseAddr("127.0.0.1"), []string{"allowed.test"}, p.pin); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(s.Port()))

	exchange := func(network string) dnsmessage.RCode {
		t.Helper()
		c, err := net.DialTimeout(network, addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		q := query(t, "allowed.test.", dnsmessage.TypeA)
		buf := make([]byte, 4096)
		var n int
		if network == "tcp" {
			_, err = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...))
			if err == nil {
				_, err = io.ReadFull(c, buf[:2])
			}
			if err == nil {
				n = int(binary.BigEndian.Uint16(buf[:2]))
				_, err = io.ReadFull(c, buf[:n])
			}
		} else {
			if _, err = c.Write(q); err == nil {
				n, err = c.Read(buf)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		var m dnsmessage.Message
		if err := m.Unpack(buf[:n]); err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		return m.RCode
	}
	for _, network := range []string{"udp", "tcp"} {
		if rc := exchange(network); rc != dnsmessage.RCodeSuccess {
			t.Errorf("over %s: %v, want success", network, rc)
		}
	}
	if len(p.addrs) != 2 {
		t.Errorf("pinned %v, want the address once per query", p.addrs)
	}
	s.Unregister(netip.MustParseAddr("127.0.0.1"))
	if rc := exchange("udp"); rc != dnsmessage.RCodeRefused {
		t.Errorf("after Unregister: %v, want refused", rc)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
