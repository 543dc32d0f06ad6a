package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestListenTaken: a listener whose address another process holds fails
// the process at start, naming the flag and the address, before it waits
// for anything (here an apiserver that never answers).
func TestListenTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	dir := t.TempDir()
	// An apiserver address nothing answers on: a process that got past
	// its listeners would wait for it.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+free()+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SANDMAN_POOL_TOKEN", "test-token")
	addr := taken.Addr().String()
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"--kubelet-listen", []string{"--kubelet-listen", addr, "--metrics-listen", free(),
			"--tls-cert-file", filepath.Join(dir, "tls.crt"), "--tls-key-file", filepath.Join(dir, "tls.key")}},
		{"--metrics-listen", []string{"--kubelet-listen", free(), "--metrics-listen", addr}},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				done <- run(append([]string{"--kubeconfig", kubeconfig, "--node-agents", "n1=127.0.0.1:1", "--log-level", "error"}, tc.args...))
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.flag) || !strings.Contains(err.Error(), addr) {
					t.Fatalf("run with %s on a taken address: %v; want an error naming %s and %s", tc.flag, err, tc.flag, addr)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("run with %s on a taken address %s has not returned after 20 s", tc.flag, addr)
			}
		})
	}
}
