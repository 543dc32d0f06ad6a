package sandboxdns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Pinner lets the sandbox reach addrs for ttl (it adds them, with that
// timeout, to the sandbox's firewall set): sandboxnet.Pin on the node.
type Pinner = func(addrs []netip.Addr, ttl time.Duration) error

// Config configures a Server.
type Config struct {
	// Listen is the UDP and TCP address to serve on (default ":0", a port
	// the kernel picks for both: see Server.Port).
	Listen string
	// Upstreams are the DNS servers (host:port) allowed queries go to, tried
	// in turn (required).
	Upstreams []string
	// MinTTL and MaxTTL clamp how long pinned addresses stay reachable
	// (defaults 30 s and 1 h): a name whose TTL is 1 s keeps its address
	// 30 s, which covers clients that cache beyond a TTL; the answer the
	// sandbox gets says the record's TTL, at most MaxTTL. Pins last
	// PinSlack more (default 10 s) than the TTL they are given for.
	MinTTL, MaxTTL, PinSlack time.Duration
	// Timeout bounds one exchange with an upstream server (default 2 s).
	Timeout time.Duration
	// MaxInFlight bounds the queries being answered at once (default 256)
	// and MaxConns the TCP connections open at once (default 64): queries
	// beyond them are dropped, connections closed. They are the node's
	// ceilings; each sandbox has its share below them.
	MaxInFlight, MaxConns int
	// MaxInFlightPerSandbox bounds one sandbox's queries being answered
	// at once (default 32: queries beyond it are refused) and
	// MaxConnsPerSandbox its TCP connections open at once (default 8:
	// connections beyond it are closed), so a sandbox whose name server
	// never answers holds its share of MaxInFlight, not all of it.
	MaxInFlightPerSandbox, MaxConnsPerSandbox int
	// QueryRate is how many queries a second one sandbox may send
	// (default 100), in bursts of up to QueryBurst (default 200): queries
	// beyond it are refused, the upstreams not asked.
	QueryRate  float64
	QueryBurst int
	// MaxAnswerAddrs bounds the addresses pinned from one answer (default
	// 16), and the answer the sandbox gets holds only those: it is never
	// given an address it cannot reach. MaxPinnedAddrs bounds the
	// addresses pinned for one sandbox at once (default 1024): an answer
	// that would pin more is refused until older pins lapse; addresses the
	// sandbox has pinned already cost nothing more.
	MaxAnswerAddrs, MaxPinnedAddrs int
	// Now is the clock of query rates and pins (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Server is the node's resolver. Create it with New (which opens its
// sockets), serve with Run.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	udp     net.PacketConn
	tcp     net.Listener
	// inFlight holds a token per query being answered; conns per TCP
	// connection.
	inFlight, conns chan struct{}

	// mu guards sandboxes and each one's budget.
	mu        sync.Mutex
	sandboxes map[netip.Addr]*sandbox
}

// sandbox is what a registered source address may resolve, where its
// answers are pinned (names and pin do not change), and what it has
// taken of the server.
type sandbox struct {
	names Names
	pin   Pinner
	budget
}

// Sizes: a query larger than maxQuery is not answered; a UDP answer is at
// most 512 bytes unless the query says its client takes more (EDNS), and
// then at most maxUDP; CNAME chains longer than maxChain are not followed.
const (
	maxQuery = 4096
	maxUDP   = 1232
	maxChain = 16
)

// New checks cfg and opens the server's sockets.
func New(cfg Config) (*Server, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("sandbox DNS: no upstream servers: give the node's DNS servers (host:port)")
	}
	for i, u := range cfg.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			if ip, perr := netip.ParseAddr(u); perr == nil {
				cfg.Upstreams[i] = netip.AddrPortFrom(ip, 53).String()
				continue
			}
			return nil, fmt.Errorf("sandbox DNS: upstream %q: want host:port or an address", u)
		}
	}
	if cfg.Listen == "" {
		cfg.Listen = ":0"
	}
	if cfg.MinTTL <= 0 {
		cfg.MinTTL = 30 * time.Second
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.MaxTTL < cfg.MinTTL {
		return nil, fmt.Errorf("sandbox DNS: MaxTTL %v is below MinTTL %v", cfg.MaxTTL, cfg.MinTTL)
	}
	if cfg.PinSlack <= 0 {
		cfg.PinSlack = 10 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 256
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 64
	}
	if cfg.MaxInFlightPerSandbox <= 0 {
		cfg.MaxInFlightPerSandbox = 32
	}
	if cfg.MaxConnsPerSandbox <= 0 {
		cfg.MaxConnsPerSandbox = 8
	}
	if cfg.QueryRate <= 0 {
		cfg.QueryRate = 100
	}
	if cfg.QueryBurst <= 0 {
		cfg.QueryBurst = 200
	}
	if cfg.MaxAnswerAddrs <= 0 {
		cfg.MaxAnswerAddrs = 16
	}
	if cfg.MaxPinnedAddrs <= 0 {
		cfg.MaxPinnedAddrs = 1024
	}
	if cfg.MaxAnswerAddrs > cfg.MaxPinnedAddrs {
		return nil, fmt.Errorf("sandbox DNS: MaxAnswerAddrs %d is above MaxPinnedAddrs %d: no answer could be pinned", cfg.MaxAnswerAddrs, cfg.MaxPinnedAddrs)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: newMetrics(), sandboxes: map[netip.Addr]*sandbox{},
		inFlight: make(chan struct{}, cfg.MaxInFlight), conns: make(chan struct{}, cfg.MaxConns)}
	if err := s.listen(); err != nil {
		return nil, fmt.Errorf("sandbox DNS: listen on %s: %w", cfg.Listen, err)
	}
	return s, nil
}

// listen opens UDP and TCP on one port: the one asked, or with port 0 the
// UDP socket's (tried again if TCP has it taken).
func (s *Server) listen() error {
	var err error
	for range 10 {
		if s.udp, err = net.ListenPacket("udp4", s.cfg.Listen); err != nil {
			return err
		}
		addr := s.udp.LocalAddr().(*net.UDPAddr)
		if s.tcp, err = net.Listen("tcp4", net.JoinHostPort(addr.IP.String(), fmt.Sprint(addr.Port))); err == nil {
			return nil
		}
		s.udp.Close()
		if _, port, _ := net.SplitHostPort(s.cfg.Listen); port != "0" {
			return err
		}
	}
	return err
}

// Port is the port the server listens on (UDP and TCP).
func (s *Server) Port() uint16 { return uint16(s.udp.LocalAddr().(*net.UDPAddr).Port) }

// Register lets the sandbox at src resolve names, its answers pinned with
// pin; it replaces what src had, budgets and all (a new sandbox in the
// slot pins into a set of its own).
func (s *Server) Register(src netip.Addr, names []string, pin Pinner) error {
	n, err := ParseNames(names)
	if err != nil {
		return err
	}
	sb := &sandbox{names: n, pin: pin, budget: s.newBudget()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sandboxes[src.Unmap()] = sb
	return nil
}

// Unregister forgets src: its queries are refused from now on.
func (s *Server) Unregister(src netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sandboxes, src.Unmap())
}

func (s *Server) lookup(src netip.Addr) *sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[src.Unmap()]
}

// Run serves until ctx ends, then closes the sockets and waits for the
// queries being answered.
func (s *Server) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		<-ctx.Done()
		s.udp.Close()
		s.tcp.Close()
	})
	wg.Go(func() { s.serveTCP(ctx, &wg) })
	buf := make([]byte, maxQuery)
	var err error
	for {
		n, from, rerr := s.udp.ReadFrom(buf)
		if rerr != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("sandbox DNS: %w", rerr)
			}
			break
		}
		src, ok := addrOf(from)
		if !ok {
			continue
		}
		done, ok := s.take(src, false)
		if !ok {
			if resp := s.refuseBusy(src, buf[:n], true); resp != nil {
				_, _ = s.udp.WriteTo(resp, from)
			}
			continue
		}
		select {
		case s.inFlight <- struct{}{}:
		default:
			done()
			s.metrics.queries.WithLabelValues(resultDropped).Inc()
			continue
		}
		query := append([]byte(nil), buf[:n]...)
		wg.Go(func() {
			defer done()
			defer func() { <-s.inFlight }()
			if resp := s.Answer(ctx, src, query, true); resp != nil {
				_, _ = s.udp.WriteTo(resp, from)
			}
		})
	}
	cancel()
	wg.Wait()
	return err
}

func (s *Server) serveTCP(ctx context.Context, wg *sync.WaitGroup) {
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("sandbox DNS: accept", "err", err)
			}
			return
		}
		src, ok := addrOf(c.RemoteAddr())
		if !ok {
			c.Close()
			continue
		}
		done, ok := s.take(src, true)
		if !ok {
			s.metrics.connsRejected.WithLabelValues(limitSandbox).Inc()
			s.warnOver(src, reasonConns)
			c.Close()
			continue
		}
		select {
		case s.conns <- struct{}{}:
		default:
			done()
			s.metrics.connsRejected.WithLabelValues(limitNode).Inc()
			c.Close()
			continue
		}
		wg.Go(func() {
			defer done()
			defer func() { <-s.conns }()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			s.serveConn(ctx, c, src)
		})
	}
}

// serveConn answers the queries of one TCP connection from src in turn
// (each length-prefixed), closing it after 10 s without one.
func (s *Server) serveConn(ctx context.Context, c net.Conn, src netip.Addr) {
	for {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if n > maxQuery {
			return
		}
		query := make([]byte, n)
		if _, err := io.ReadFull(c, query); err != nil {
			return
		}
		resp, ok := s.answerTCP(ctx, src, query)
		if !ok {
			return
		}
		if resp == nil {
			return
		}
		if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(resp)))); err != nil {
			return
		}
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// answerTCP answers query from src under the budgets of queries in flight:
// false when the node has none left (the connection is to close).
func (s *Server) answerTCP(ctx context.Context, src netip.Addr, query []byte) ([]byte, bool) {
	done, ok := s.take(src, false)
	if !ok {
		return s.refuseBusy(src, query, false), true
	}
	defer done()
	select {
	case s.inFlight <- struct{}{}:
	default:
		s.metrics.queries.WithLabelValues(resultDropped).Inc()
		return nil, false
	}
	defer func() { <-s.inFlight }()
	return s.Answer(ctx, src, query, false), true
}

func addrOf(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	}
	return netip.Addr{}, false
}

// typeHTTPS and typeSVCB are the service binding types, whose address
// hints would bypass pinning.
const (
	typeSVCB  dnsmessage.Type = 64
	typeHTTPS dnsmessage.Type = 65
)

// Answer answers query from src (over UDP when udp, which bounds the
// answer's size): nil when there is nothing to answer (not a query).
func (s *Server) Answer(ctx context.Context, src netip.Addr, query []byte, udp bool) []byte {
	resp, result := s.answer(ctx, src, query, udp)
	s.metrics.queries.WithLabelValues(result).Inc()
	return resp
}

// request is a query being answered: the reply begun (the query's ID and
// question), the question, how large the reply may be, and whether the
// client speaks EDNS.
type request struct {
	reply dnsmessage.Message
	q     dnsmessage.Question
	limit int
	edns  bool
}

// parse reads query: the request, or (req nil) the whole answer when it is
// not a query this server answers.
func parse(query []byte, udp bool) (req *request, resp []byte, result string) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, nil, resultMalformed
	}
	reply := dnsmessage.Message{Header: dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		reply.RCode = dnsmessage.RCodeFormatError
		return nil, pack(reply, 512), resultMalformed
	}
	reply.Questions = qs
	if h.OpCode != 0 {
		reply.RCode = dnsmessage.RCodeNotImplemented
		return nil, pack(reply, 512), resultMalformed
	}
	req = &request{reply: reply, q: qs[0], limit: 65535}
	size, edns := ednsOf(&p)
	req.edns = edns
	if udp {
		req.limit = size
	}
	return req, nil, ""
}

func (s *Server) answer(ctx context.Context, src netip.Addr, query []byte, udp bool) ([]byte, string) {
	req, resp, result := parse(query, udp)
	if req == nil {
		return resp, result
	}
	reply, q, limit := &req.reply, req.q, req.limit
	sb := s.lookup(src)
	if sb == nil {
		reply.RCode = dnsmessage.RCodeRefused
		return pack(*reply, limit), resultUnknown
	}
	if !sb.rate.AllowN(s.cfg.Now(), 1) {
		return s.limited(req, src, reasonRate)
	}
	name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
	if q.Class != dnsmessage.ClassINET || !sb.names.Allows(name) {
		reply.RCode = dnsmessage.RCodeRefused
		return pack(*reply, limit), resultRefused
	}
	switch q.Type {
	case dnsmessage.TypeAAAA, typeHTTPS, typeSVCB:
		return pack(*reply, limit), resultEmpty
	}
	up, err := s.exchange(ctx, q)
	if err != nil {
		s.log.Warn("sandbox DNS: no upstream answered", "name", name, "sandbox", src, "err", err)
		reply.RCode = dnsmessage.RCodeServerFailure
		return pack(*reply, limit), resultFailed
	}
	reply.RCode = up.RCode
	if up.RCode != dnsmessage.RCodeSuccess {
		return pack(*reply, limit), resultForwarded
	}
	if q.Type != dnsmessage.TypeA {
		for _, a := range up.Answers {
			a.Header.TTL = min(a.Header.TTL, uint32(s.cfg.MaxTTL/time.Second))
			reply.Answers = append(reply.Answers, a)
		}
		return pack(*reply, limit), resultForwarded
	}
	answers, addrs, ttl := s.chain(q.Name, up.Answers)
	reply.Answers = answers
	if len(addrs) == 0 {
		return pack(*reply, limit), resultForwarded
	}
	d := ttl + s.cfg.PinSlack
	if !s.reservePins(sb, addrs, s.cfg.Now().Add(d)) {
		return s.limited(req, src, reasonPinned)
	}
	// A failed pin stays counted until it would have lapsed: the count
	// errs toward the cap.
	if err := sb.pin(addrs, d); err != nil {
		s.log.Warn("sandbox DNS: pin the addresses of a name", "name", name, "sandbox", src, "err", err)
		reply.RCode, reply.Answers = dnsmessage.RCodeServerFailure, nil
		return pack(*reply, limit), resultFailed
	}
	s.confirmPins(sb, addrs, d)
	return pack(*reply, limit), resultPinned
}

// ednsOf reads the query's EDNS record (p is past the questions): how
// large a UDP answer may be, 512 bytes or what the record says its client
// takes (at most maxUDP), and whether there is one.
func ednsOf(p *dnsmessage.Parser) (int, bool) {
	if p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return 512, false
	}
	adds, _ := p.AllAdditionals()
	for _, a := range adds {
		if a.Header.Type == dnsmessage.TypeOPT {
			// An OPT record's class is the UDP payload size.
			return min(max(512, int(a.Header.Class)), maxUDP), true
		}
	}
	return 512, false
}

// chain follows answers from name: the CNAMEs from it and the A records
// of the name they end at, in order, with their TTLs at most MaxTTL;
// their addresses; and how long to pin those (the chain's shortest TTL,
// clamped to [MinTTL, MaxTTL]). Records of other names are left out, and
// so are A records past the first MaxAnswerAddrs addresses and repeats.
func (s *Server) chain(name dnsmessage.Name, answers []dnsmessage.Resource) ([]dnsmessage.Resource, []netip.Addr, time.Duration) {
	var out []dnsmessage.Resource
	var addrs []netip.Addr
	maxTTL := uint32(s.cfg.MaxTTL / time.Second)
	shortest := maxTTL
	at := strings.ToLower(name.String())
	dropped := 0
	for range maxChain {
		var next string
		for _, a := range answers {
			if a.Header.Class != dnsmessage.ClassINET || strings.ToLower(a.Header.Name.String()) != at {
				continue
			}
			switch b := a.Body.(type) {
			case *dnsmessage.AResource:
				addr := netip.AddrFrom4(b.A)
				if slices.Contains(addrs, addr) {
					continue
				}
				if len(addrs) == s.cfg.MaxAnswerAddrs {
					dropped++
					continue
				}
				addrs = append(addrs, addr)
			case *dnsmessage.CNAMEResource:
				if next == "" {
					next = strings.ToLower(b.CNAME.String())
				}
			default:
				continue
			}
			a.Header.TTL = min(a.Header.TTL, maxTTL)
			shortest = min(shortest, a.Header.TTL)
			out = append(out, a)
		}
		if len(addrs) > 0 || next == "" {
			break
		}
		at = next
	}
	s.metrics.addrsDropped.Add(float64(dropped))
	ttl := min(max(time.Duration(shortest)*time.Second, s.cfg.MinTTL), s.cfg.MaxTTL)
	return out, addrs, ttl
}

// pack packs m; a UDP answer larger than limit goes with no records and
// the truncated bit, so the client asks again over TCP.
func pack(m dnsmessage.Message, limit int) []byte {
	b, err := m.Pack()
	if err == nil && len(b) <= limit {
		return b
	}
	m.Truncated = err == nil
	if err != nil {
		m.RCode = dnsmessage.RCodeServerFailure
	}
	m.Answers, m.Authorities, m.Additionals = nil, nil, nil
	b, _ = m.Pack()
	return b
}

// exchange asks the upstream servers q in turn until one answers: over
// UDP, and again over TCP when the answer is truncated.
func (s *Server) exchange(ctx context.Context, q dnsmessage.Question) (*dnsmessage.Message, error) {
	var errs []error
	for _, up := range s.cfg.Upstreams {
		m, err := s.ask(ctx, "udp", up, q)
		if err == nil && m.Truncated {
			m, err = s.ask(ctx, "tcp", up, q)
		}
		if err == nil {
			return m, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// ask sends q to upstream over network with a random ID (from a random
// port, on a connected socket) and reads the answer that matches it.
func (s *Server) ask(ctx context.Context, network, upstream string, q dnsmessage.Question) (*dnsmessage.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	id := uint16(rand.Uint32())
	query, err := (&dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true}, Questions: []dnsmessage.Question{q}}).Pack()
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, upstream)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 65535)
	if network == "tcp" {
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(query))), query...)); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return nil, err
		}
		n := int(binary.BigEndian.Uint16(buf[:2]))
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return nil, err
		}
		return match(buf[:n], id, q)
	}
	if _, err := c.Write(query); err != nil {
		return nil, err
	}
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		// Not the answer to this query (a late one, a forgery): wait on.
		if m, err := match(buf[:n], id, q); err == nil {
			return m, nil
		}
	}
}

// match parses an upstream answer and checks it answers query id for q.
func match(b []byte, id uint16, q dnsmessage.Question) (*dnsmessage.Message, error) {
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		return nil, fmt.Errorf("unreadable answer: %w", err)
	}
	if !m.Response || m.ID != id || len(m.Questions) != 1 || m.Questions[0].Type != q.Type ||
		!strings.EqualFold(m.Questions[0].Name.String(), q.Name.String()) {
		return nil, errors.New("an answer to another query")
	}
	return &m, nil
}
