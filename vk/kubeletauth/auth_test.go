package kubeletauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

const nodeName = "sandman-default"

// reviews is the apiserver as the tests see it: bearer tokens "token-<user>"
// are valid, other tokens not; allow decides SubjectAccessReviews. It
// records every review made. It answers over HTTP: k8s.io/apiserver's
// webhook authenticator and authorizer post through the typed clients'
// RESTClient(), which client-go's fake clientset does not have, so its
// reactors would never see a review.
type reviews struct {
	allow func(authorizationv1.SubjectAccessReviewSpec) bool
	// sarFails, when set, fails every SubjectAccessReview (400).
	sarFails bool

	// mu guards the fields below.
	mu           sync.Mutex
	tokenReviews int
	sars         []authorizationv1.SubjectAccessReviewSpec
}

func (rv *reviews) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		var tr authenticationv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rv.mu.Lock()
		rv.tokenReviews++
		rv.mu.Unlock()
		if name, ok := strings.CutPrefix(tr.Spec.Token, "token-"); ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: name, Groups: []string{"users"}}}
		} else {
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		writeJSON(w, http.StatusCreated, &tr)
	})
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, r *http.Request) {
		var sar authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rv.mu.Lock()
		rv.sars = append(rv.sars, sar.Spec)
		rv.mu.Unlock()
		if rv.sarFails {
			writeJSON(w, http.StatusBadRequest, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest, Message: "no"})
			return
		}
		sar.Status.Allowed = rv.allow != nil && rv.allow(sar.Spec)
		writeJSON(w, http.StatusCreated, &sar)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (rv *reviews) counts() (tokenReviews int, sars []authorizationv1.SubjectAccessReviewSpec) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return rv.tokenReviews, slices.Clone(rv.sars)
}

// grants allows user the subresources of the node (any verb).
func grants(user string, subresources ...string) func(authorizationv1.SubjectAccessReviewSpec) bool {
	return func(s authorizationv1.SubjectAccessReviewSpec) bool {
		return s.User == user && s.ResourceAttributes != nil && s.ResourceAttributes.Name == nodeName &&
			slices.Contains(subresources, s.ResourceAttributes.Subresource)
	}
}

type testCert struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newCert(t *testing.T, parent *testCert, cn string, orgs ...string) *testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	signer, signerKey := tmpl, crypto.Signer(key)
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage, tmpl.ExtKeyUsage = true, true, x509.KeyUsageCertSign, nil
	} else {
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

// request is one call on the kubelet port: a method and a path, with a
// bearer token or a client certificate, or neither.
type request struct {
	method, path, token string
	cert                *testCert
}

func (q request) do(h http.Handler) *httptest.ResponseRecorder {
	r := httptest.NewRequest(q.method, "https://10.0.0.1:10250"+q.path, nil)
	r.TLS = &tls.ConnectionState{HandshakeComplete: true}
	if q.cert != nil {
		r.TLS.PeerCertificates = []*x509.Certificate{q.cert.cert}
	}
	if q.token != "" {
		r.Header.Set("Authorization", "Bearer "+q.token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

type fixture struct {
	rv      *reviews
	handler http.Handler
	// ran counts requests that reached the kubelet API's handler.
	ran *int
}

func newFixture(t *testing.T, ca *testCert, rv *reviews, mutate ...func(*Config)) fixture {
	t.Helper()
	cfg := Config{NodeName: nodeName, Client: rv.client(t), TokenWebhook: true}
	if ca != nil {
		provider, err := dynamiccertificates.NewStaticCAContent("test-client-ca", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ClientCA = provider
	}
	for _, m := range mutate {
		m(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ran := new(int)
	return fixture{rv: rv, ran: ran, handler: a.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		*ran++
		_, _ = w.Write([]byte("ok"))
	}))}
}

func TestAuthenticateAndAuthorize(t *testing.T) {
	ca := newCert(t, nil, "cluster-ca")
	otherCA := newCert(t, nil, "other-ca")
	apiserverClient := newCert(t, ca, "kube-apiserver-kubelet-client", "kubeadm:cluster-admins")
	otherNode := newCert(t, ca, "system:node:other", "system:nodes")
	stranger := newCert(t, otherCA, "kube-apiserver-kubelet-client")

	// The apiserver's client and alice hold nodes/proxy (and so every
	// kubelet path through proxy); metrics-server stats and metrics.
	allow := func(s authorizationv1.SubjectAccessReviewSpec) bool {
		return grants("kube-apiserver-kubelet-client", "proxy", "stats", "metrics", "log")(s) ||
			grants("alice", "proxy")(s) || grants("metrics", "stats", "metrics")(s) || grants("podlister", "pods")(s)
	}
	exec := "/exec/ns/box/task?command=ls&output=1"
	type sar struct{ verb, subresource string }
	for _, tc := range []struct {
		name   string
		req    request
		status int
		// sars are the SubjectAccessReviews expected, in order.
		sars []sar
		user string
		// body, when set, is the response body expected.
		body string
	}{
		{name: "anonymous exec", req: request{method: "POST", path: exec}, status: 401},
		{name: "anonymous stats", req: request{method: "GET", path: "/stats/summary"}, status: 401},
		{name: "token TokenReview rejects", req: request{method: "POST", path: exec, token: "forged"}, status: 401},
		{name: "client cert from another CA", req: request{method: "GET", path: "/containerLogs/ns/box/task", cert: stranger}, status: 401},

		{name: "bob exec", req: request{method: "POST", path: exec, token: "token-bob"}, status: 403, user: "bob",
			sars: []sar{{"create", "proxy"}}, body: "Forbidden (user=bob, verb=create, resource=nodes, subresource(s)=[proxy])\n"},
		{name: "bob containerLogs", req: request{method: "GET", path: "/containerLogs/ns/box/task?follow=true", token: "token-bob"}, status: 403, user: "bob",
			sars: []sar{{"get", "proxy"}}, body: "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[proxy])\n"},
		{name: "bob stats/summary", req: request{method: "GET", path: "/stats/summary", token: "token-bob"}, status: 403, user: "bob",
			sars: []sar{{"get", "stats"}}, body: "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[stats])\n"},
		{name: "bob metrics/resource", req: request{method: "GET", path: "/metrics/resource", token: "token-bob"}, status: 403, user: "bob",
			sars: []sar{{"get", "metrics"}}},
		{name: "bob logs", req: request{method: "GET", path: "/logs/", token: "token-bob"}, status: 403, user: "bob", sars: []sar{{"get", "log"}}},
		{name: "bob pods: pods, then proxy", req: request{method: "GET", path: "/pods", token: "token-bob"}, status: 403, user: "bob",
			sars: []sar{{"get", "pods"}, {"get", "proxy"}}, body: "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"},
		{name: "bob pre-pull", req: request{method: "POST", path: "/sandman/v1/prepull", token: "token-bob"}, status: 403, user: "bob", sars: []sar{{"create", "proxy"}}},
		{name: "bob snapshot", req: request{method: "POST", path: "/sandman/v1/snapshot", token: "token-bob"}, status: 403, user: "bob",
			sars: []sar{{"create", "proxy"}}, body: "Forbidden (user=bob, verb=create, resource=nodes, subresource(s)=[proxy])\n"},
		{name: "bob capacity page", req: request{method: "GET", path: "/capacity", token: "token-bob"}, status: 403, user: "bob", sars: []sar{{"get", "proxy"}}},

		{name: "alice exec", req: request{method: "POST", path: exec, token: "token-alice"}, status: 200, user: "alice", sars: []sar{{"create", "proxy"}}},
		{name: "alice snapshot", req: request{method: "POST", path: "/sandman/v1/snapshot", token: "token-alice"}, status: 200, user: "alice", sars: []sar{{"create", "proxy"}}},
		{name: "alice containerLogs", req: request{method: "GET", path: "/containerLogs/ns/box/task", token: "token-alice"}, status: 200, user: "alice", sars: []sar{{"get", "proxy"}}},
		{name: "alice stats: stats is not proxy", req: request{method: "GET", path: "/stats/summary", token: "token-alice"}, status: 403, user: "alice", sars: []sar{{"get", "stats"}}},
		{name: "alice pods through proxy", req: request{method: "GET", path: "/runningpods/", token: "token-alice"}, status: 200, user: "alice",
			sars: []sar{{"get", "pods"}, {"get", "proxy"}}},
		{name: "podlister pods", req: request{method: "GET", path: "/pods", token: "token-podlister"}, status: 200, user: "podlister", sars: []sar{{"get", "pods"}}},
		{name: "metrics-server stats", req: request{method: "GET", path: "/stats/summary", token: "token-metrics"}, status: 200, user: "metrics", sars: []sar{{"get", "stats"}}},
		{name: "metrics-server exec", req: request{method: "POST", path: exec, token: "token-metrics"}, status: 403, user: "metrics", sars: []sar{{"create", "proxy"}}},

		{name: "apiserver's client cert exec", req: request{method: "POST", path: exec, cert: apiserverClient}, status: 200,
			user: "kube-apiserver-kubelet-client", sars: []sar{{"create", "proxy"}}},
		{name: "apiserver's client cert stats", req: request{method: "GET", path: "/stats/summary", cert: apiserverClient}, status: 200,
			user: "kube-apiserver-kubelet-client", sars: []sar{{"get", "stats"}}},
		{name: "another node's cert exec", req: request{method: "POST", path: exec, cert: otherNode}, status: 403, user: "system:node:other",
			sars: []sar{{"create", "proxy"}}, body: "Forbidden (user=system:node:other, verb=create, resource=nodes, subresource(s)=[proxy])\n"},
		{name: "another node's cert containerLogs", req: request{method: "GET", path: "/containerLogs/ns/box/task", cert: otherNode}, status: 403,
			user: "system:node:other", sars: []sar{{"get", "proxy"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, ca, &reviews{allow: allow})
			w := tc.req.do(f.handler)
			if w.Code != tc.status {
				t.Fatalf("status %d %q, want %d", w.Code, w.Body.String(), tc.status)
			}
			if want := tc.status == 200; (*f.ran == 1) != want {
				t.Fatalf("handler ran %d times, want it to run: %v", *f.ran, want)
			}
			if tc.body != "" && w.Body.String() != tc.body {
				t.Fatalf("body %q, want %q", w.Body.String(), tc.body)
			}
			_, sars := f.rv.counts()
			if len(sars) != len(tc.sars) {
				t.Fatalf("%d SubjectAccessReviews %+v, want %v", len(sars), sars, tc.sars)
			}
			for i, s := range sars {
				ra := s.ResourceAttributes
				want := authorizationv1.ResourceAttributes{Verb: tc.sars[i].verb, Version: "v1", Resource: "nodes", Subresource: tc.sars[i].subresource, Name: nodeName}
				if ra == nil || *ra != want {
					t.Errorf("SubjectAccessReview %d asks %+v, want %+v", i, ra, want)
				}
				if s.User != tc.user {
					t.Errorf("SubjectAccessReview %d for user %q, want %q", i, s.User, tc.user)
				}
				if !slices.Contains(s.Groups, "system:authenticated") {
					t.Errorf("SubjectAccessReview %d groups %v lack system:authenticated", i, s.Groups)
				}
			}
			if tc.req.cert == otherNode && len(sars) > 0 && !slices.Contains(sars[0].Groups, "system:nodes") {
				t.Errorf("a node's certificate authenticated with groups %v, want system:nodes (for the Node authorizer)", sars[0].Groups)
			}
		})
	}
}

// TestCache: a burst of kubectl exec costs one TokenReview and one
// SubjectAccessReview; refusals are cached too.
func TestCache(t *testing.T) {
	f := newFixture(t, nil, &reviews{allow: grants("alice", "proxy")})
	for _, token := range []string{"token-alice", "token-bob"} {
		for range 5 {
			request{method: "POST", path: "/exec/ns/box/task?command=ls", token: token}.do(f.handler)
		}
	}
	if trs, sars := f.rv.counts(); trs != 2 || len(sars) != 2 {
		t.Fatalf("10 requests of two users made %d TokenReviews and %d SubjectAccessReviews, want 2 and 2", trs, len(sars))
	}
	if *f.ran != 5 {
		t.Fatalf("handler ran %d times, want 5 (alice's)", *f.ran)
	}
	// Another verb or subresource is another review.
	request{method: "GET", path: "/containerLogs/ns/box/task", token: "token-alice"}.do(f.handler)
	if _, sars := f.rv.counts(); len(sars) != 3 {
		t.Fatalf("%d SubjectAccessReviews after a GET, want 3", len(sars))
	}
}

func TestModes(t *testing.T) {
	t.Run("anonymous allowed, then authorized", func(t *testing.T) {
		f := newFixture(t, nil, &reviews{}, func(c *Config) { c.Anonymous = true })
		w := request{method: "GET", path: "/stats/summary"}.do(f.handler)
		if w.Code != 403 || w.Body.String() != "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[stats])\n" {
			t.Fatalf("%d %q", w.Code, w.Body.String())
		}
	})
	t.Run("AlwaysAllow: authenticated is enough", func(t *testing.T) {
		f := newFixture(t, nil, &reviews{}, func(c *Config) { c.Mode = ModeAlwaysAllow })
		if w := (request{method: "POST", path: "/exec/ns/box/task", token: "token-bob"}).do(f.handler); w.Code != 200 {
			t.Fatalf("%d %q", w.Code, w.Body.String())
		}
		if w := (request{method: "POST", path: "/exec/ns/box/task"}).do(f.handler); w.Code != 401 {
			t.Fatalf("anonymous: %d %q", w.Code, w.Body.String())
		}
		if _, sars := f.rv.counts(); len(sars) != 0 {
			t.Fatalf("AlwaysAllow made SubjectAccessReviews: %v", sars)
		}
	})
	t.Run("tokens off: a token is anonymous", func(t *testing.T) {
		ca := newCert(t, nil, "ca")
		f := newFixture(t, ca, &reviews{allow: grants("bob", "proxy")}, func(c *Config) { c.TokenWebhook = false })
		if w := (request{method: "GET", path: "/pods", token: "token-bob"}).do(f.handler); w.Code != 401 {
			t.Fatalf("%d %q", w.Code, w.Body.String())
		}
		if trs, _ := f.rv.counts(); trs != 0 {
			t.Fatalf("%d TokenReviews with tokens off", trs)
		}
	})
	t.Run("review fails: 500", func(t *testing.T) {
		f := newFixture(t, nil, &reviews{sarFails: true})
		w := request{method: "GET", path: "/stats/summary", token: "token-bob"}.do(f.handler)
		if w.Code != 500 || *f.ran != 0 {
			t.Fatalf("%d %q", w.Code, w.Body.String())
		}
	})
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no node", Config{Client: fake.NewClientset(), TokenWebhook: true}},
		{"no way to authenticate", Config{NodeName: nodeName, Client: fake.NewClientset()}},
		{"webhook without client", Config{NodeName: nodeName, Anonymous: true}},
		{"unknown mode", Config{NodeName: nodeName, Client: fake.NewClientset(), TokenWebhook: true, Mode: "RBAC"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}
