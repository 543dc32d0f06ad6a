package kubeletcert

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
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	testUser = "system:serviceaccount:sandman-system:sandman-vk"
	testNode = "sandman-default"
)

var (
	testIP  = net.ParseIP("127.0.0.1")
	csrGVR  = schema.GroupVersionResource{Group: "certificates.k8s.io", Version: "v1", Resource: "certificatesigningrequests"}
	csrGVK  = schema.GroupVersionKind{Group: "certificates.k8s.io", Version: "v1", Kind: "CertificateSigningRequest"}
	csrPath = "certificatesigningrequests"
)

// poll calls cond every 5 ms until it holds, failing with what after 15 s.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cluster is client-go's fake clientset made to act like an apiserver for
// CSRs where it matters here: it names requests (generateName), records who
// made them, answers SelfSubjectReviews, and honours metadata.name field
// selectors (client-go's certificate manager waits for its request with one).
type cluster struct {
	*kfake.Clientset
	n atomic.Int64
}

func newCluster(user string) *cluster {
	c := &cluster{Clientset: kfake.NewClientset()}
	c.PrependReactor("create", "selfsubjectreviews", func(k8stesting.Action) (bool, kruntime.Object, error) {
		return true, &authenticationv1.SelfSubjectReview{Status: authenticationv1.SelfSubjectReviewStatus{
			UserInfo: authenticationv1.UserInfo{Username: user}}}, nil
	})
	c.PrependReactor("create", csrPath, func(a k8stesting.Action) (bool, kruntime.Object, error) {
		csr := a.(k8stesting.CreateAction).GetObject().(*certificatesv1.CertificateSigningRequest)
		if csr.Name == "" {
			csr.Name = fmt.Sprintf("%s%d", csr.GenerateName, c.n.Add(1))
		}
		csr.UID = types.UID("uid-" + csr.Name)
		csr.Spec.Username = user
		return false, nil, nil // the tracker stores it
	})
	c.PrependReactor("list", csrPath, func(a k8stesting.Action) (bool, kruntime.Object, error) {
		name, ok := a.(k8stesting.ListActionImpl).GetListRestrictions().Fields.RequiresExactMatch("metadata.name")
		if !ok {
			return false, nil, nil
		}
		obj, err := c.Tracker().List(csrGVR, csrGVK, "")
		if err != nil {
			return true, nil, err
		}
		list := obj.(*certificatesv1.CertificateSigningRequestList)
		var items []certificatesv1.CertificateSigningRequest
		for _, item := range list.Items {
			if item.Name == name {
				items = append(items, item)
			}
		}
		list.Items = items
		return true, list, nil
	})
	c.PrependWatchReactor(csrPath, func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchActionImpl)
		name, ok := wa.GetWatchRestrictions().Fields.RequiresExactMatch("metadata.name")
		if !ok {
			return false, nil, nil
		}
		w, err := c.Tracker().Watch(csrGVR, "", wa.ListOptions)
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			o, ok := e.Object.(metav1.Object)
			return e, ok && o.GetName() == name
		}), nil
	})
	return c
}

func (c *cluster) csr(t *testing.T, name string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr, err := c.CertificatesV1().CertificateSigningRequests().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

// testCA signs approved kubelet-serving requests as kube-controller-
// manager's csrsigning controller does.
type testCA struct {
	cert     *x509.Certificate
	key      crypto.Signer
	lifetime time.Duration
}

func newTestCA(t *testing.T, lifetime time.Duration) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-cluster-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, lifetime: lifetime}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// sign issues a certificate for a CSR.
func (ca *testCA) sign(csr *certificatesv1.CertificateSigningRequest) ([]byte, error) {
	req, err := parseRequest(csr.Spec.Request)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: req.Subject, DNSNames: req.DNSNames, IPAddresses: req.IPAddresses,
		NotBefore: now.Add(-time.Second), NotAfter: now.Add(ca.lifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, req.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// run signs approved kubelet-serving requests until ctx ends.
func (ca *testCA) run(ctx context.Context, t *testing.T, c *cluster) {
	w, err := c.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Error(err)
		return
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.ResultChan():
			csr, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
			if !ok || len(csr.Status.Certificate) > 0 || csr.Spec.SignerName != SignerName {
				continue
			}
			if _, done := decided(csr); !done {
				continue
			}
			pemCert, err := ca.sign(csr)
			if err != nil {
				t.Error(err)
				return
			}
			csr = csr.DeepCopy()
			csr.Status.Certificate = pemCert
			if _, err := c.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}
	}
}

// start runs a Manager (and the CA's signer, when ca is not nil) until the
// test ends.
func start(t *testing.T, c *cluster, ca *testCA) *Manager {
	t.Helper()
	m, err := New(Config{Client: c, NodeName: testNode, NodeIPs: []net.IP{testIP}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	if ca != nil {
		wg.Go(func() { ca.run(ctx, t, c) })
	}
	wg.Go(func() {
		if err := m.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("Run: %v", err)
		}
	})
	return m
}

// handshake makes an HTTPS request to a TLS listener serving m's
// certificate (as virtual-kubelet's kubelet port does), verifying it against
// the CA for the node's IP, and returns the serial number presented.
func handshake(t *testing.T, m *Manager, ca *testCA) *big.Int {
	t.Helper()
	l, err := tls.Listen("tcp", net.JoinHostPort(testIP.String(), "0"), &tls.Config{GetCertificate: m.GetCertificate})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatalf("TLS to the kubelet port: %v", err)
	}
	resp.Body.Close()
	return resp.TLS.PeerCertificates[0].SerialNumber
}

func TestManagerGetsItsOwnRequestApproved(t *testing.T) {
	c := newCluster(testUser)
	// A kubelet-serving request from somebody else, for this very node.
	foreign := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "foreign"},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: SignerName, Username: "system:node:worker-1",
			Usages: usages, Request: request(t, nil, "system:node:"+testNode, []string{nodesGroup}, []string{testNode}, []net.IP{testIP})},
	}
	if err := c.Tracker().Add(foreign); err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t, time.Hour)
	m := start(t, c, ca)
	if _, err := m.GetCertificate(nil); err == nil {
		t.Fatal("GetCertificate before issue: no error")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	cert, err := m.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	switch {
	case leaf.Subject.CommonName != "system:node:"+testNode, len(leaf.Subject.Organization) != 1 || leaf.Subject.Organization[0] != nodesGroup:
		t.Fatalf("subject %v", leaf.Subject)
	case len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != testNode, len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(testIP):
		t.Fatalf("SANs %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
	handshake(t, m, ca)

	own := c.csr(t, "csr-1")
	if own.Spec.SignerName != SignerName || !sameUsages(own.Spec.Usages, usages) {
		t.Fatalf("request spec: signer %q usages %v", own.Spec.SignerName, own.Spec.Usages)
	}
	approved := false
	for _, cond := range own.Status.Conditions {
		approved = approved || cond.Type == certificatesv1.CertificateApproved && cond.Reason == ApproveReason && cond.Status == "True"
	}
	if !approved {
		t.Fatalf("own request's conditions: %+v", own.Status.Conditions)
	}
	if f := c.csr(t, "foreign"); len(f.Status.Conditions) != 0 {
		t.Fatalf("somebody else's request was touched: %+v", f.Status.Conditions)
	}
}

func TestManagerRenewsWithoutRestart(t *testing.T) {
	c := newCluster(testUser)
	// Certificates that live 3 s: the manager renews at 70-90 % of that.
	ca := newTestCA(t, 3*time.Second)
	m := start(t, c, ca)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	first := handshake(t, m, ca)
	poll(t, "a renewed certificate", func() bool {
		c, err := m.GetCertificate(nil)
		return err == nil && c.Leaf.SerialNumber.Cmp(first) != 0
	})
	if second := handshake(t, m, ca); second.Cmp(first) == 0 {
		t.Fatal("the TLS server still presents the first certificate")
	}
}

func TestWaitSaysWhatToCheck(t *testing.T) {
	forbid := func(verb, resource, sub string) func(*cluster) {
		return func(c *cluster) {
			c.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, kruntime.Object, error) {
				if a.GetSubresource() != sub {
					return false, nil, nil
				}
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "", fmt.Errorf("RBAC: denied"))
			})
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(*cluster)
		want  []string
	}{
		{"no signer", nil, []string{"csr-1 is approved and has no certificate yet", "csrsigning", "--cluster-signing-cert-file"}},
		{"approval forbidden", forbid("update", csrPath, "approval"), []string{"csr-1 is pending: approving it failed", "approve on signers"}},
		{"identity unknown", forbid("create", "selfsubjectreviews", ""), []string{"SelfSubjectReview", "selfsubjectreviews"}},
		{"requests forbidden", forbid("create", csrPath, ""), []string{"no CertificateSigningRequest of its own", "create/get/list/watch on certificatesigningrequests"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(testUser)
			if tc.setup != nil {
				tc.setup(c)
			}
			m := start(t, c, nil)
			done, cancel := context.WithCancel(t.Context())
			cancel()
			var last string
			poll(t, fmt.Sprintf("Wait's error to contain %q", tc.want), func() bool {
				err := m.Wait(done)
				if err == nil {
					t.Fatal("Wait: no error without a certificate")
				}
				last = err.Error()
				for _, w := range tc.want {
					if !strings.Contains(last, w) {
						return false
					}
				}
				return true
			})
			t.Log(last)
		})
	}
}

// request makes a PEM certificate request; key nil: a fresh key.
func request(t *testing.T, key crypto.Signer, cn string, orgs, dns []string, ips []net.IP, mutate ...func(*x509.CertificateRequest)) []byte {
	t.Helper()
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}, DNSNames: dns, IPAddresses: ips}
	for _, f := range mutate {
		f(tmpl)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestRefusal(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	want := expectation{username: testUser, node: testNode, ips: []net.IP{testIP, net.ParseIP("fd00::1")}, keys: [][]byte{der}}
	cn, orgs, dns, ips := "system:node:"+testNode, []string{nodesGroup}, []string{testNode}, []net.IP{testIP}
	good := func() *certificatesv1.CertificateSigningRequest {
		return &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: SignerName, Username: testUser, Usages: usages, Request: request(t, key, cn, orgs, dns, ips)}}
	}
	with := func(f func(*certificatesv1.CertificateSigningRequest)) *certificatesv1.CertificateSigningRequest {
		csr := good()
		f(csr)
		return csr
	}
	withRequest := func(cn string, orgs, dns []string, ips []net.IP, mutate ...func(*x509.CertificateRequest)) *certificatesv1.CertificateSigningRequest {
		return with(func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Request = request(t, key, cn, orgs, dns, ips, mutate...)
		})
	}
	for _, tc := range []struct {
		name string
		csr  *certificatesv1.CertificateSigningRequest
		want string // "" approves; else a part of the reason
	}{
		{"own request", good(), ""},
		{"own request, IP only, no key encipherment", with(func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Request = request(t, key, cn, orgs, nil, []net.IP{net.ParseIP("fd00::1")})
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
		}), ""},
		{"other signer", with(func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.SignerName = "kubernetes.io/kube-apiserver-client"
		}), "signer"},
		{"other requester", with(func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Username = "system:node:worker-1" }), "requested by"},
		{"other node", withRequest("system:node:worker-1", orgs, dns, ips), "common name"},
		{"no node prefix", withRequest(testNode, orgs, dns, ips), "common name"},
		{"extra organization", withRequest(cn, []string{nodesGroup, "system:masters"}, dns, ips), "organization"},
		{"no organization", withRequest(cn, nil, dns, ips), "organization"},
		{"foreign DNS name", withRequest(cn, orgs, []string{testNode, "kubernetes.default"}, ips), "DNS name"},
		{"foreign IP", withRequest(cn, orgs, dns, []net.IP{net.ParseIP("10.0.0.9")}), "IP address"},
		{"email SAN", withRequest(cn, orgs, dns, ips, func(r *x509.CertificateRequest) { r.EmailAddresses = []string{"a@b.c"} }), "email or URI"},
		{"URI SAN", withRequest(cn, orgs, dns, ips, func(r *x509.CertificateRequest) { r.URIs = []*url.URL{{Scheme: "spiffe", Host: "x"}} }), "email or URI"},
		{"no SAN", withRequest(cn, orgs, nil, nil), "no subject alternative name"},
		{"client auth", with(func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageClientAuth)
		}), "usage"},
		{"no server auth", with(func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}
		}), "usages"},
		{"not our key", with(func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Request = request(t, nil, cn, orgs, dns, ips)
		}), "public key"},
		{"not PEM", with(func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Request = []byte("junk") }), "PEM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := refusal(tc.csr, want)
			switch {
			case tc.want == "" && got != "":
				t.Fatalf("refused: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Fatalf("refusal %q, want one about %q", got, tc.want)
			}
		})
	}
}

func sameUsages(a, b []certificatesv1.KeyUsage) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
