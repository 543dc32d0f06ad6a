package sandboxdns

import (
	"encoding/binary"
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/time/rate"
)

// A sandbox's budgets are what one registered sandbox may take of the
// server, so that a sandbox whose name server is slow, whose client floods,
// or whose names resolve to many addresses costs the other sandboxes on
// the node nothing. Its queries in flight and TCP connections are counted
// by the transports (Run, serveTCP, serveConn) before the node's budgets
// (MaxInFlight, MaxConns): a sandbox at its share takes none of the
// node's. Its query rate and the addresses pinned for it are checked by
// answer.

// Reasons a query is refused for a budget of its sandbox's, the reason
// label of sandman_node_dns_refused_total.
const (
	// reasonInFlight: MaxInFlightPerSandbox queries of the sandbox are
	// being answered.
	reasonInFlight = "in_flight"
	// reasonRate: the sandbox's queries are over QueryRate.
	reasonRate = "rate"
	// reasonPinned: the answer would put more than MaxPinnedAddrs pins on
	// the sandbox.
	reasonPinned = "pinned"
)

// reasonConns names the TCP connection budget in the log.
const reasonConns = "tcp_connections"

// edeText is what the Extended DNS Error of a refusal for each reason
// says.
var edeText = map[string]string{
	reasonInFlight: "sandman: too many queries of this sandbox in flight",
	reasonRate:     "sandman: this sandbox's query rate is over its budget",
	reasonPinned:   "sandman: this sandbox has too many addresses pinned",
}

// edeProhibited is the Extended DNS Error (RFC 8914) info code for "the
// server is unable to respond because of policy"; edeOption its option
// code in an OPT record.
const (
	edeProhibited = 18
	edeOption     = 15
)

// budget is what a sandbox has taken of the server. Its fields but rate
// (which locks itself) are guarded by Server.mu.
type budget struct {
	rate            *rate.Limiter
	inFlight, conns int
	// pinned are the addresses pinned for the sandbox and when their pins
	// lapse, as this server last set them (some may have lapsed since).
	pinned map[netip.Addr]time.Time
	// warned are the budgets the sandbox has been logged over.
	warned map[string]bool
}

func (s *Server) newBudget() budget {
	return budget{rate: rate.NewLimiter(rate.Limit(s.cfg.QueryRate), s.cfg.QueryBurst),
		pinned: map[netip.Addr]time.Time{}, warned: map[string]bool{}}
}

// take counts one more query (conn: TCP connection) of the sandbox at src
// as open, and returns what gives it back; false when the sandbox has its
// budget's worth open already. An address nobody registered is counted
// nothing: its queries are refused at once, under the node's budgets.
func (s *Server) take(src netip.Addr, conn bool) (done func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[src]
	if sb == nil {
		return func() {}, true
	}
	n, limit := &sb.inFlight, s.cfg.MaxInFlightPerSandbox
	if conn {
		n, limit = &sb.conns, s.cfg.MaxConnsPerSandbox
	}
	if *n >= limit {
		return nil, false
	}
	*n++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		*n--
	}, true
}

// reservePins counts addrs as pinned for sb until until; false, counting
// nothing, when that would put more than MaxPinnedAddrs pins on it.
// Addresses it has pinned already cost nothing more.
func (s *Server) reservePins(sb *sandbox, addrs []netip.Addr, until time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	fresh := func() int {
		n := 0
		for _, a := range addrs {
			if _, ok := sb.pinned[a]; !ok {
				n++
			}
		}
		return n
	}
	if len(sb.pinned)+fresh() > s.cfg.MaxPinnedAddrs {
		now := s.cfg.Now()
		for a, lapse := range sb.pinned {
			if !lapse.After(now) {
				delete(sb.pinned, a)
			}
		}
		if len(sb.pinned)+fresh() > s.cfg.MaxPinnedAddrs {
			return false
		}
	}
	s.markPinsLocked(sb, addrs, until)
	return true
}

// markPinsLocked records addrs as pinned for sb until at least until.
func (s *Server) markPinsLocked(sb *sandbox, addrs []netip.Addr, until time.Time) {
	for _, a := range addrs {
		if sb.pinned[a].Before(until) {
			sb.pinned[a] = until
		}
	}
}

// confirmPins records, once the firewall has them, that addrs lapse after d
// from now: the kernel's timeouts run from then, not from the reservation.
func (s *Server) confirmPins(sb *sandbox, addrs []netip.Addr, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.markPinsLocked(sb, addrs, s.cfg.Now().Add(d))
}

// limited answers req from src REFUSED for a budget of its sandbox's,
// saying which in an Extended DNS Error when the client speaks EDNS, and
// counts it.
func (s *Server) limited(req *request, src netip.Addr, reason string) ([]byte, string) {
	s.metrics.refused.WithLabelValues(reason).Inc()
	s.warnOver(src, reason)
	req.reply.RCode = dnsmessage.RCodeRefused
	req.reply.Answers = nil
	if req.edns {
		var h dnsmessage.ResourceHeader
		_ = h.SetEDNS0(maxUDP, dnsmessage.RCodeSuccess, false)
		ede := binary.BigEndian.AppendUint16(nil, edeProhibited)
		ede = append(ede, edeText[reason]...)
		req.reply.Additionals = []dnsmessage.Resource{{Header: h,
			Body: &dnsmessage.OPTResource{Options: []dnsmessage.Option{{Code: edeOption, Data: ede}}}}}
	}
	return pack(req.reply, req.limit), resultLimited
}

// refuseBusy answers query from src, whose sandbox has its budget of
// queries in flight: REFUSED, saying so.
func (s *Server) refuseBusy(src netip.Addr, query []byte, udp bool) []byte {
	req, resp, result := parse(query, udp)
	if req != nil {
		resp, result = s.limited(req, src, reasonInFlight)
	}
	s.metrics.queries.WithLabelValues(result).Inc()
	return resp
}

// warnOver logs that the sandbox at src is over a budget, once per
// registration and budget: sandman_node_dns_refused_total counts the rest.
func (s *Server) warnOver(src netip.Addr, reason string) {
	s.mu.Lock()
	sb := s.sandboxes[src]
	first := sb != nil && !sb.warned[reason]
	if first {
		sb.warned[reason] = true
	}
	s.mu.Unlock()
	if first {
		s.log.Warn("sandbox DNS: a sandbox is over a budget: refusing what is past it (logged once; see sandman_node_dns_refused_total)",
			"sandbox", src, "budget", reason)
	}
}
