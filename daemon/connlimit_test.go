package daemon_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon"
)

// TestConnectionsPerClientBounded: a client holding the most connections
// one address may hold gets 429 on the next, and its place back when it
// closes one.
func TestConnectionsPerClientBounded(t *testing.T) {
	srv, err := daemon.New(daemon.Config{
		TokenHashes:       [][sha256.Size]byte{sha256.Sum256([]byte(testToken))},
		StateDir:          t.TempDir(),
		MaxConnsPerClient: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-served })

	// status sends GET /v1/health on c and returns the status code.
	status := func(c net.Conn) (int, error) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("GET /v1/health HTTP/1.1\r\nHost: sandbox\r\n\r\n")); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	var held []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if code, err := status(c); err != nil || code != http.StatusOK {
			t.Fatalf("connection %d: %d %v", i, code, err)
		}
		held = append(held, c)
	}
	over, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if code, err := status(over); err != nil || code != http.StatusTooManyRequests {
		t.Fatalf("a fourth connection: %d %v, want 429", code, err)
	}
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		code, err := status(c)
		c.Close()
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a place freed by a closed connection was not given back: %d %v", code, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
