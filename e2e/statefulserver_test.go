//go:build root || e2e

package e2e

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// askServer reads one line from the stateful test server at ip:8080 (the
// pause and fork tests' Python servers) and returns its fields.
func askServer(t *testing.T, ip string) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", ip+":8080", 5*time.Second)
	if err != nil {
		t.Fatalf("the server at %s: %v", ip, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("the server at %s: %v", ip, err)
	}
	return strings.Fields(line)
}
