package main

import (
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
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
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

// TestKubeletTLS checks the kubelet port's TLS as nodeutil builds it: the
// serving certificate from the certificate manager or from files, and
// client certificates from --client-ca-file required when it is given.
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
		ok       bool
	}{
		{name: "manager, CA, apiserver's client cert", getCert: fromManager, clientCA: caFile, client: apiserver, ok: true},
		{name: "manager, CA, no client cert", getCert: fromManager, clientCA: caFile},
		{name: "manager, CA, client cert from another CA", getCert: fromManager, clientCA: caFile, client: stranger},
		{name: "manager, no CA", getCert: fromManager, ok: true},
		{name: "files, CA, apiserver's client cert", clientCA: caFile, client: apiserver, ok: true},
		{name: "files, CA, no client cert", clientCA: caFile},
		{name: "files, no CA", ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg nodeutil.NodeConfig
			if err := nodeutil.WithTLSConfig(kubeletTLSOptions(certFile, keyFile, tc.clientCA, tc.getCert)...)(&cfg); err != nil {
				t.Fatal(err)
			}
			l, err := tls.Listen("tcp", "127.0.0.1:0", cfg.TLSConfig)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ReadHeaderTimeout: 10 * time.Second}
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
			if err == nil {
				resp.Body.Close()
			}
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.ok && err == nil:
				t.Fatal("a client without a certificate from the client CA got in")
			case err == nil && resp.TLS.PeerCertificates[0].Subject.CommonName != "system:node:sandman-default":
				t.Fatalf("served %v", resp.TLS.PeerCertificates[0].Subject)
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
