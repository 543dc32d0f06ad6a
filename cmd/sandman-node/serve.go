package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
)

// server is the node API's listener, served from the start: until the
// agent serves (serving), every request hears why it does not
// (setStatus), as do a readiness probe (--status-file) and the virtual node.
type server struct {
	o        options
	log      *slog.Logger
	handler  atomic.Pointer[http.Handler]
	notReady atomic.Value
	hs       *http.Server
	served   chan error
}

// listenAPI binds --listen (with mutual TLS under --node-api-tls: apiCerts
// is then started, and stopped by the returned cleanup), guards it with
// --guard-cidr and serves "not serving" until ctx ends.
func listenAPI(ctx context.Context, o options, log *slog.Logger) (s *server, apiCerts *nodetls.AgentCerts, cleanup func(), err error) {
	var cleanups []func()
	cleanup = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, nil, nil, err
	}
	if o.nodeAPITLS {
		if apiCerts, err = agentCerts(o, log); err != nil {
			return nil, nil, nil, err
		}
		apiCerts.Start()
		cleanups = append(cleanups, apiCerts.Stop)
		l = tls.NewListener(l, apiCerts.TLSConfig())
	}
	for cidr := range strings.SplitSeq(o.guardCIDR, ",") {
		if cidr = strings.TrimSpace(cidr); cidr == "" {
			continue
		}
		unguard, err := noderuntime.GuardPort(cidr, l.Addr().(*net.TCPAddr).Port)
		if err != nil {
			return nil, nil, nil, err
		}
		cleanups = append(cleanups, func() {
			if err := unguard(); err != nil {
				log.Error("remove the node API guard", "err", err)
			}
		})
	}
	s = &server{o: o, log: log, served: make(chan error, 1)}
	s.setStatus("starting")
	waiting := nodeapi.NotServing(func() string { return fmt.Sprintf("node agent %s not serving: %s", o.node, s.notReady.Load()) })
	s.handler.Store(&waiting)
	s.hs = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*s.handler.Load()).ServeHTTP(w, r) }), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.hs.Shutdown(sctx)
	}()
	go func() { s.served <- s.hs.Serve(l) }()
	log.Info("listening", "listen", o.listen, "node", o.node)
	return s, apiCerts, cleanup, nil
}

// setStatus says why the agent does not serve ("ok" once it does).
func (s *server) setStatus(msg string) {
	s.notReady.Store(msg)
	if s.o.statusFile != "" {
		if err := os.WriteFile(s.o.statusFile, []byte(msg+"\n"), 0o644); err != nil {
			s.log.Error("status file", "err", err)
		}
	}
}

// serve switches the listener to h and says so.
func (s *server) serve(h http.Handler) {
	s.handler.Store(&h)
	s.setStatus("ok")
}

// wait waits until the listener is shut down (ctx ended).
func (s *server) wait() error {
	if err := <-s.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// agentCerts prepares the node API certificate for the node's IP in
// --listen, requested with the pod's ServiceAccount.
func agentCerts(o options, log *slog.Logger) (*nodetls.AgentCerts, error) {
	host, _, err := net.SplitHostPort(o.listen)
	ip := net.ParseIP(host)
	if err != nil || ip == nil || ip.IsUnspecified() {
		return nil, fmt.Errorf("--node-api-tls: --listen %q must name the node's IP (sandman-vk dials it and the certificate names it)", o.listen)
	}
	kc, err := kubeClient(o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--node-api-tls: %w", err)
	}
	return nodetls.NewAgentCerts(kc, o.node, []net.IP{ip}, log)
}
