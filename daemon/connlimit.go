package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
)

// clientLimit is a listener that holds at most max connections open per
// client address. A connection over the bound is answered 429 with a JSON
// error and closed, so a flood from one address (another sandbox, a runaway
// client) cannot take the connections and goroutines every other client
// needs.
type clientLimit struct {
	net.Listener
	max int
	log *slog.Logger

	// mu guards open (connections held per client IP) and logged (when a
	// refusal was last logged: a flood logs once in 10 s).
	mu     sync.Mutex
	open   map[string]int
	logged time.Time
}

func newClientLimit(l net.Listener, max int, log *slog.Logger) *clientLimit {
	return &clientLimit{Listener: l, max: max, log: log, open: map[string]int{}}
}

func (l *clientLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		if l.open[host] >= l.max {
			if now := time.Now(); now.Sub(l.logged) > 10*time.Second {
				l.logged = now
				l.log.Warn("too many connections from one client: refusing", "client", host, "max", l.max)
			}
			l.mu.Unlock()
			l.refuse(c, host)
			continue
		}
		l.open[host]++
		l.mu.Unlock()
		return &limitedConn{Conn: c, release: func() { l.done(host) }}, nil
	}
}

func (l *clientLimit) done(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[host]--; l.open[host] <= 0 {
		delete(l.open, host)
	}
}

// refuse answers a connection over the bound without reading its request,
// in the accept loop, so a flood costs no goroutine per connection.
func (l *clientLimit) refuse(c net.Conn, host string) {
	defer c.Close()
	body := fmt.Sprintf(`{"error":{"code":%q,"message":"%d connections from %s are open to this sandbox already (the daemon's limit per client): reuse connections or close some"}}`,
		api.CodeTooManyRequests, l.max, host)
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// limitedConn gives its client's place back once, when closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
