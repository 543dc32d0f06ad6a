package vk

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// A GET sent while nothing listens is answered once the server comes up;
// a POST fails at once; a GET gives up when its context ends.
func TestWaitForAPIServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens now

	cfg := &rest.Config{Host: "http://" + addr}
	waitForAPIServer(cfg, 20*time.Millisecond, time.Minute)
	tr, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: tr}

	post, _ := http.NewRequest(http.MethodPost, cfg.Host+"/api/v1/namespaces/x/pods", nil)
	if _, err := hc.Do(post); err == nil {
		t.Fatal("a POST while nothing listens succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	get, _ := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/api/v1/pods", nil)
	start := time.Now()
	if _, err := hc.Do(get); err == nil {
		t.Fatal("a GET while nothing listens succeeded")
	} else if time.Since(start) < 90*time.Millisecond {
		t.Fatalf("a GET gave up after %v, before its context ended: %v", time.Since(start), err)
	}

	done := make(chan error, 1)
	go func() {
		resp, err := hc.Get(cfg.Host + "/api/v1/pods")
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the GET ended before the server came up: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the GET after the server came up: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the GET did not reach the server within 10 s of its start")
	}
}
