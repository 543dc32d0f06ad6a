package nodeapi_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
)

// agentCert has ca sign node's agent request for ip, as sandman-vk does.
func agentCert(t *testing.T, ca *nodetls.CA, node string, ip net.IP) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: nodetls.AgentCN(node)}, DNSNames: []string{node}, IPAddresses: []net.IP{ip},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodetls.CheckAgentRequest(csr, node, []net.IP{ip}); err != nil {
		t.Fatal(err)
	}
	chain, err := ca.SignAgent(csr, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(chain, pemEncode("PRIVATE KEY", keyDER))
	if err != nil {
		t.Fatal(err)
	}
	return &cert
}

// serveTLS serves a fake runtime over the node API's mutual TLS as node's
// agent with a certificate from ca; it returns the address.
func serveTLS(t *testing.T, ca *nodetls.CA, node string) string {
	t.Helper()
	rt, err := fake.New(fake.Config{Node: node, Slots: 2, Images: []string{"busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, ClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	cert := agentCert(t, ca, node, net.IPv4(127, 0, 0, 1))
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.TLS = nodetls.ServerTLS(func() *tls.Certificate { return cert }, node)
	ts.StartTLS()
	t.Cleanup(func() { rt.Close(); ts.CloseClientConnections(); ts.Close() })
	return strings.TrimPrefix(ts.URL, "https://")
}

// TestMutualTLS: only the control plane's certificate from the pool CA
// calls the node API, and it reaches only the agent of the node it means.
func TestMutualTLS(t *testing.T) {
	ca, err := nodetls.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	addrA := serveTLS(t, ca, "worker-a")
	cc, err := nodetls.NewAuthority(ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	if _, err := nodeapi.NewTLSClient(addrA, cc.TLSConfig("worker-a")).Inventory(ctx); err != nil {
		t.Fatalf("the control plane's certificate: %v", err)
	}
	// Dialing worker-b's agent but reaching worker-a's: refused by the client.
	if _, err := nodeapi.NewTLSClient(addrA, cc.TLSConfig("worker-b")).Inventory(ctx); err == nil {
		t.Error("a client meaning worker-b accepted worker-a's agent")
	}

	// Another agent's certificate, from the same CA, as a client: refused
	// in the handshake (server-auth usage only).
	other := agentCert(t, ca, "worker-b", net.IPv4(127, 0, 0, 1))
	withCert := func(c *tls.Certificate) *tls.Config {
		cfg := cc.TLSConfig("worker-a")
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c, nil }
		return cfg
	}
	if _, err := nodeapi.NewTLSClient(addrA, withCert(other)).Inventory(ctx); err == nil {
		t.Error("another agent's certificate was accepted as a caller")
	}
	// A control-plane certificate from another CA: refused.
	foreign, err := nodetls.NewCA("foreign")
	if err != nil {
		t.Fatal(err)
	}
	fc, err := foreign.IssueClient(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeapi.NewTLSClient(addrA, withCert(fc)).Inventory(ctx); err == nil {
		t.Error("a certificate of another CA was accepted")
	}
	// No certificate: the TLS handshake passes (for /healthz and /metrics)
	// and the API says 401 with the reason.
	none := withCert(&tls.Certificate{})
	c := nodeapi.NewTLSClient(addrA, none)
	if _, err := c.Inventory(ctx); !errdefs.IsUnauthorized(err) || !strings.Contains(err.Error(), "control plane") {
		t.Errorf("no client certificate: err = %v, want unauthorized naming the control plane's certificate", err)
	}
	// A bearer token gets nothing over TLS.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addrA+"/v1/inventory", nil)
	req.Header.Set("Authorization", "Bearer pool-secret")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: none}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("bearer token over TLS: status %d, want 401", resp.StatusCode)
	}
	resp, err = hc.Get("https://" + addrA + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz without a certificate: status %d, want 200", resp.StatusCode)
	}
}

// TestCheckAgentRequest: an agent may ask only for its own node's name and
// addresses.
func TestCheckAgentRequest(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ip := net.IPv4(10, 0, 0, 7)
	good := x509.CertificateRequest{Subject: pkix.Name{CommonName: nodetls.AgentCN("w1")}, DNSNames: []string{"w1"}, IPAddresses: []net.IP{ip}}
	for _, tc := range []struct {
		name   string
		mutate func(*x509.CertificateRequest)
		want   string
	}{
		{"ok", func(*x509.CertificateRequest) {}, ""},
		{"other node's name", func(r *x509.CertificateRequest) { r.Subject.CommonName = nodetls.AgentCN("w2") }, "common name"},
		{"control plane's name", func(r *x509.CertificateRequest) {
			r.Subject = pkix.Name{CommonName: nodetls.ControlPlaneCN, Organization: []string{nodetls.ControlPlaneGroup}}
		}, "common name"},
		{"organization", func(r *x509.CertificateRequest) { r.Subject.Organization = []string{nodetls.ControlPlaneGroup} }, "organization"},
		{"extra DNS name", func(r *x509.CertificateRequest) { r.DNSNames = []string{"w1", "w2"} }, "DNS names"},
		{"foreign IP", func(r *x509.CertificateRequest) { r.IPAddresses = []net.IP{net.IPv4(10, 0, 0, 8)} }, "10.0.0.8"},
		{"no IP", func(r *x509.CertificateRequest) { r.IPAddresses = nil }, "no IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := good
			tc.mutate(&tmpl)
			der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
			if err != nil {
				t.Fatal(err)
			}
			csr, err := x509.ParseCertificateRequest(der)
			if err != nil {
				t.Fatal(err)
			}
			err = nodetls.CheckAgentRequest(csr, "w1", []net.IP{ip})
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func pemEncode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// TestCARotation: while a rotation keeps the previous CA, sandman-vk calls
// agents certified by either (with a client certificate from the CA each
// trusts); once the previous CA is dropped, only agents with a certificate
// from the new one answer.
func TestCARotation(t *testing.T) {
	oldCA, err := nodetls.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := nodetls.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	oldAgent, newAgent := serveTLS(t, oldCA, "w-old"), serveTLS(t, newCA, "w-new")
	auth, err := nodetls.NewAuthority(oldCA, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	try := func(addr, node string) error {
		_, err := nodeapi.NewTLSClient(addr, auth.TLSConfig(node)).Inventory(ctx)
		return err
	}
	if err := try(oldAgent, "w-old"); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	if err := try(newAgent, "w-new"); err == nil {
		t.Fatal("before the rotation an agent of the new CA answered")
	}
	if err := auth.Set(newCA, oldCA); err != nil {
		t.Fatal(err)
	}
	if err := try(oldAgent, "w-old"); err != nil {
		t.Errorf("during the rotation, an agent of the previous CA: %v", err)
	}
	if err := try(newAgent, "w-new"); err != nil {
		t.Errorf("during the rotation, an agent of the new CA: %v", err)
	}
	if auth.Current() != newCA {
		t.Error("the new CA does not sign")
	}
	if err := auth.Set(newCA, nil); err != nil {
		t.Fatal(err)
	}
	if err := try(newAgent, "w-new"); err != nil {
		t.Errorf("after the rotation, an agent of the new CA: %v", err)
	}
	if err := try(oldAgent, "w-old"); err == nil {
		t.Error("after the rotation an agent still certified by the dropped CA answered")
	}
}
