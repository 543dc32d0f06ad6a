package main

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/sandman-dev/sandman/vk/kubeletauth"
)

// testCert is a certificate and its key, signed by parent (nil: itself).
type testCert struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newTestCert(t *testing.T, parent *testCert, cn string, ca bool) *testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if ca {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	}
	signer, signerKey := tmpl, crypto.Signer(key)
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, key.Public(), signerKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCert{cert: c, key: key}
}

func (c *testCert) pem(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func (c *testCert) tls(t *testing.T) tls.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(c.pem(t))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubeletTLS checks the kubelet port's TLS as nodeutil builds it, with
// kubeletauth behind it as main wires them: the serving certificate from the
// certificate manager or from files; with --client-ca-file a client
// certificate is asked for but not required (a token may come instead), and
// one from the CA authenticates; without, none is asked for.
func TestKubeletTLS(t *testing.T) {
	clusterCA := newTestCert(t, nil, "cluster-ca", true)
	otherCA := newTestCert(t, nil, "other-ca", true)
	serving := newTestCert(t, clusterCA, "system:node:sandman-default", false)
	apiserver := newTestCert(t, clusterCA, "kube-apiserver-kubelet-client", false)
	stranger := newTestCert(t, otherCA, "stranger", false)
	caFile := writeFile(t, "ca.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clusterCA.cert.Raw}))
	certPEM, keyPEM := serving.pem(t)
	certFile, keyFile := writeFile(t, "tls.crt", certPEM), writeFile(t, "tls.key", keyPEM)
	servingPair := serving.tls(t)
	fromManager := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &servingPair, nil }

	for _, tc := range []struct {
		name     string
		getCert  func(*tls.ClientHelloInfo) (*tls.Certificate, error)
		clientCA string
		client   *testCert
		// status is kubeletauth's answer (AlwaysAllow: 200 for a
		// certificate from the CA, 401 otherwise); without a CA, 200 and
		// the handler checks that no certificate came.
		status int
	}{
		{name: "manager, CA, apiserver's client cert", getCert: fromManager, clientCA: caFile, client: apiserver, status: 200},
		{name: "manager, CA, no client cert", getCert: fromManager, clientCA: caFile, status: 401},
		{name: "manager, CA, client cert from another CA", getCert: fromManager, clientCA: caFile, client: stranger, status: 401},
		{name: "manager, no CA, client cert not asked for", getCert: fromManager, client: apiserver, status: 200},
		{name: "files, CA, apiserver's client cert", clientCA: caFile, client: apiserver, status: 200},
		{name: "files, CA, no client cert", clientCA: caFile, status: 401},
		{name: "files, no CA", status: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg nodeutil.NodeConfig
			if err := nodeutil.WithTLSConfig(kubeletTLSOptions(certFile, keyFile, tc.clientCA, tc.getCert)...)(&cfg); err != nil {
				t.Fatal(err)
			}
			var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.clientCA == "" && len(r.TLS.PeerCertificates) > 0 {
					t.Error("a client certificate was asked for without a client CA")
				}
			})
			if tc.clientCA != "" {
				// Static: the file's (main watches it) without a goroutine to stop.
				ca, err := dynamiccertificates.NewStaticCAContent("client-ca", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clusterCA.cert.Raw}))
				if err != nil {
					t.Fatal(err)
				}
				auth, err := kubeletauth.New(kubeletauth.Config{NodeName: "sandman-default", ClientCA: ca, Mode: kubeletauth.ModeAlwaysAllow})
				if err != nil {
					t.Fatal(err)
				}
				h = auth.Handler(h)
			}
			l, err := tls.Listen("tcp", "127.0.0.1:0", cfg.TLSConfig)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(l) }()
			defer srv.Close()

			roots := x509.NewCertPool()
			roots.AddCert(clusterCA.cert)
			clientTLS := &tls.Config{RootCAs: roots}
			if tc.client != nil {
				clientTLS.Certificates = []tls.Certificate{tc.client.tls(t)}
			}
			tr := &http.Transport{TLSClientConfig: clientTLS}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Get("https://" + l.Addr().String() + "/pods")
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if cn := resp.TLS.PeerCertificates[0].Subject.CommonName; cn != "system:node:sandman-default" {
				t.Fatalf("served %v", cn)
			}
		})
	}
}

func TestServingMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    options
		want string // "" for an error
	}{
		{"in-cluster default", options{}, servingCSR},
		{"in-cluster with files", options{tlsCert: "c"}, servingFile},
		{"kubeconfig default", options{kubeconfig: "k"}, servingFile},
		{"explicit csr with kubeconfig", options{kubeconfig: "k", servingCert: "csr"}, servingCSR},
		{"explicit file in-cluster", options{servingCert: "file"}, servingFile},
		{"csr and files", options{servingCert: "csr", tlsCert: "c"}, ""},
		{"unknown", options{servingCert: "acme"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := servingMode(tc.o)
			if got != tc.want || (err == nil) != (tc.want != "") {
				t.Fatalf("servingMode = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestReloadingKeyPair: a serving certificate in files (a mounted Secret)
// is served again once the files are replaced, without a restart.
func TestReloadingKeyPair(t *testing.T) {
	ca := newTestCert(t, nil, "cluster-ca", true)
	first, second := newTestCert(t, ca, "first", false), newTestCert(t, ca, "second", false)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	// Replace both files by rename, as an atomic writer of a Secret does.
	put := func(c *testCert) {
		certPEM, keyPEM := c.pem(t)
		for f, b := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
			if err := os.WriteFile(f+".tmp", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(f+".tmp", f); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(first)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	get, err := reloadingKeyPair(ctx, &wg, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	served := func() string {
		c, err := get(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Subject.CommonName
	}
	if cn := served(); cn != "first" {
		t.Fatalf("served %q, want first", cn)
	}
	put(second)
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return served() == "second", nil
	}); err != nil {
		t.Fatalf("still serving %q after the files changed: %v", served(), err)
	}
	if _, err := reloadingKeyPair(ctx, &wg, certFile, ""); err == nil {
		t.Error("no key file: no error")
	}
}
