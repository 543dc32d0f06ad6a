package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client that trickles its body is cut within BodyReadTimeout, not
// held for as long as it keeps sending: on the control API (408, the
// connection closed) and on sandbox traffic the proxy refuses (401 at
// once, the connection closed once the drain's time is up).
func TestTrickledBodyCut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name, head string
		status     int
	}{
		{"control API", "POST /v2/sandboxes HTTP/1.1\r\nHost: gw\r\nX-API-Key: " + rawKeyA + "\r\nContent-Type: application/json\r\n", http.StatusRequestTimeout},
		{"refused sandbox traffic", "POST /process.Process/List HTTP/1.1\r\nHost: gw\r\nE2b-Sandbox-Id: sbxnone\r\nE2b-Sandbox-Port: 49983\r\nContent-Type: application/json\r\n", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.BodyReadTimeout = timeout })
			conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, tc.head+"Content-Length: 100000\r\n\r\n{"); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := io.WriteString(conn, " "); err != nil {
							return
						}
					}
				}
			}()
			defer func() { close(stop); <-done }()
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer while trickling: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, body, tc.status)
			}
			// The server closes the connection: a read ends (EOF or a
			// reset), long before the test's own deadline.
			_, err = br.ReadByte()
			if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
				t.Fatalf("the connection is still open after the answer: %v", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("cut after %s; the timeout is %s", d, timeout)
			}
			if tc.status == http.StatusRequestTimeout && !strings.Contains(string(body), "did not arrive within 300ms") {
				t.Fatalf("body %s", body)
			}
		})
	}
}
