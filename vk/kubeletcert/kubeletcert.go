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
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	certificateslisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/certificate"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/sandman-dev/sandman/internal/certstore"
)

const (
	// SignerName is the signer of kubelet serving certificates.
	SignerName = certificatesv1.KubeletServingSignerName
	// ApproveReason is the reason on the Approved condition of the requests
	// the Manager approves.
	ApproveReason = "SandmanVKSelfApprove"
	// nodesGroup is the organization of every node certificate.
	nodesGroup = "system:nodes"
	// keysKept is how many of its newest generated keys the Manager
	// remembers: a renewal makes a new key each time, and only a request
	// for one of those is approved.
	keysKept = 4
)

// usages of a kubelet serving certificate, as the kubelet asks for them with
// an RSA key (kube-controller-manager accepts this set for any key).
var usages = []certificatesv1.KeyUsage{
	certificatesv1.UsageDigitalSignature,
	certificatesv1.UsageKeyEncipherment,
	certificatesv1.UsageServerAuth,
}

// Config configures a Manager.
type Config struct {
	Client kubernetes.Interface
	// NodeName is the virtual node's name: the certificate is for
	// system:node:<NodeName>, and NodeName is one of its DNS names.
	NodeName string
	// NodeIPs are the addresses the apiserver dials (the node's
	// InternalIPs); at least one is required, since the apiserver verifies
	// the IP it connects to.
	NodeIPs []net.IP
	Logger  *slog.Logger
}

// Manager keeps a kubelet serving certificate for the virtual node, issued
// through the cluster's CSR API and renewed before it expires, and approves
// its own requests. Serve TLS with GetCertificate; Run it; Wait for the first
// certificate before serving.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	certs certificate.Manager
	store *certstore.Memory
	queue workqueue.TypedRateLimitingInterface[string]

	// mu guards keys, username, identityErr, lister and requests.
	mu sync.Mutex
	// keys are the PKIX DER forms of the newest public keys this process
	// generated, oldest first.
	keys [][]byte
	// username is who the apiserver says this process is (the
	// spec.username of its requests); identityErr why it is not known yet.
	username    string
	identityErr error
	lister      certificateslisters.CertificateSigningRequestLister
	// requests: the state of this process's own requests by name, newest
	// last in order, for Wait's message.
	requests map[string]string
	order    []string
}

// New returns a Manager. It makes no request until Run.
func New(cfg Config) (*Manager, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("kubeletcert: Client is required")
	case cfg.NodeName == "":
		return nil, errors.New("kubeletcert: NodeName is required")
	case len(cfg.NodeIPs) == 0:
		return nil, errors.New("kubeletcert: at least one node IP is required (the apiserver verifies the address it dials)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Manager{
		cfg:   cfg,
		log:   cfg.Logger.With("vnode", cfg.NodeName),
		store: certstore.New("kubelet serving certificate"),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "sandman-kubelet-serving-csr"}),
		requests: map[string]string{},
	}
	// The certificate manager logs through klog's contextual logger: ours.
	logCtx := klog.NewContext(context.Background(), logr.FromSlogHandler(m.log.With("component", "kubelet-serving-cert").Handler()))
	var err error
	m.certs, err = certificate.NewManager(&certificate.Config{
		ClientsetFn: func(*tls.Certificate) (kubernetes.Interface, error) { return cfg.Client, nil },
		Template: &x509.CertificateRequest{
			Subject:     pkix.Name{CommonName: "system:node:" + cfg.NodeName, Organization: []string{nodesGroup}},
			DNSNames:    []string{cfg.NodeName},
			IPAddresses: cfg.NodeIPs,
		},
		SignerName:       SignerName,
		Usages:           usages,
		CertificateStore: m.store,
		GenerateKey:      m.generateKey,
		Name:             "kubelet-serving",
		Ctx:              &logCtx,
	})
	if err != nil {
		return nil, fmt.Errorf("kubeletcert: %w", err)
	}
	return m, nil
}

// generateKey makes the key for a new request and remembers its public
// half, so the approver knows the request is this process's own.
func (m *Manager) generateKey() (crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.keys = append(m.keys, der)
	if len(m.keys) > keysKept {
		m.keys = m.keys[len(m.keys)-keysKept:]
	}
	m.mu.Unlock()
	return key, nil
}

// GetCertificate serves the current certificate (tls.Config.GetCertificate):
// a renewed one is used from the next handshake on.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := m.certs.Current(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("virtual node %s has no valid kubelet serving certificate yet", m.cfg.NodeName)
}

// Expiry is when the current certificate expires (zero: none yet).
func (m *Manager) Expiry() time.Time {
	if c := m.certs.Current(); c != nil && c.Leaf != nil {
		return c.Leaf.NotAfter
	}
	return time.Time{}
}

// Wait blocks until the first certificate is issued. When ctx ends first,
// the error says how far the request got and what to check.
func (m *Manager) Wait(ctx context.Context) error {
	select {
	case <-m.store.Issued():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no kubelet serving certificate for virtual node %s: %s", m.cfg.NodeName, m.diagnosis())
	}
}

// rbacHint names what sandman-vk needs to get its certificate.
const rbacHint = "sandman-vk's RBAC needs create/get/list/watch on certificatesigningrequests, " +
	"update on certificatesigningrequests/approval and approve on signers (resourceName kubernetes.io/kubelet-serving)"

// signerHint names what signs kubelet-serving requests.
const signerHint = "kube-controller-manager's csrsigning controller signs them with the cluster CA: " +
	"check that it runs with --cluster-signing-cert-file and --cluster-signing-key-file " +
	"(or --cluster-signing-kubelet-serving-cert-file/-key-file) and that its controllers include csrsigning"

// diagnosis says how far the newest request got.
func (m *Manager) diagnosis() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.identityErr != nil:
		return fmt.Sprintf("could not learn its own identity with a SelfSubjectReview (%v); %s, and create on selfsubjectreviews", m.identityErr, rbacHint)
	case m.lister == nil:
		return "it was still starting (identity known, watch of certificatesigningrequests not synced); " + rbacHint
	case len(m.order) == 0:
		return fmt.Sprintf("no CertificateSigningRequest of its own (signer %s, requested by %s) was seen; %s", SignerName, m.username, rbacHint)
	}
	name := m.order[len(m.order)-1]
	return fmt.Sprintf("CertificateSigningRequest %s %s", name, m.requests[name])
}

// Run learns the process's identity, follows kubelet-serving requests,
// starts the certificate manager and approves the process's own requests
// until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	defer m.queue.ShutDown()
	if err := m.learnIdentity(ctx); err != nil {
		return err
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", SignerName).String()
			return m.cfg.Client.CertificatesV1().CertificateSigningRequests().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", SignerName).String()
			return m.cfg.Client.CertificatesV1().CertificateSigningRequests().Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, m.cfg.Client),
		&certificatesv1.CertificateSigningRequest{}, 0, cache.Indexers{})
	enqueue := func(obj any) {
		if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
			m.queue.Add(csr.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("watch certificatesigningrequests: %w (%s)", ctx.Err(), rbacHint)
	}
	m.mu.Lock()
	m.lister = certificateslisters.NewCertificateSigningRequestLister(inf.GetIndexer())
	m.mu.Unlock()

	// The certificate manager's goroutines end with Stop; it offers no way
	// to wait for them.
	m.certs.Start()
	defer m.certs.Stop()
	wg.Go(func() {
		<-ctx.Done()
		m.queue.ShutDown()
	})
	for m.processNext(ctx) {
	}
	return nil
}

// learnIdentity asks the apiserver who this process is, until it answers.
func (m *Manager) learnIdentity(ctx context.Context) error {
	return wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := m.cfg.Client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err == nil && r.Status.UserInfo.Username == "" {
			err = errors.New("the SelfSubjectReview answer has no username")
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.identityErr = err
		if err != nil {
			m.log.Warn("learning own identity for kubelet serving certificate requests", "err", err)
			return false, nil
		}
		m.username = r.Status.UserInfo.Username
		m.log.Info("kubelet serving certificate requests are made as", "user", m.username)
		return true, nil
	})
}

func (m *Manager) processNext(ctx context.Context) bool {
	name, quit := m.queue.Get()
	if quit {
		return false
	}
	defer m.queue.Done(name)
	if err := m.process(ctx, name); err != nil {
		m.log.Warn("approving own kubelet serving certificate request", "csr", name, "err", err)
		m.queue.AddRateLimited(name)
		return true
	}
	m.queue.Forget(name)
	return true
}

// process approves a request when it is this process's own and exactly
// what it should be, records the state of its own requests, and logs why
// any other pending kubelet-serving request is left alone.
func (m *Manager) process(ctx context.Context, name string) error {
	m.mu.Lock()
	csr, err := m.lister.Get(name)
	want := expectation{username: m.username, node: m.cfg.NodeName, ips: m.cfg.NodeIPs, keys: m.keys}
	m.mu.Unlock()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	ours := want.ownKey(csr)
	if state, done := decided(csr); done {
		if ours {
			m.record(name, state)
		}
		return nil
	}
	if why := refusal(csr, want); why != "" {
		if ours {
			m.record(name, "is pending and not approved: "+why)
		}
		m.log.Info("kubelet serving certificate request left alone", "csr", name, "user", csr.Spec.Username, "reason", why)
		return nil
	}
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: "True", Reason: ApproveReason,
		Message:        fmt.Sprintf("sandman-vk approved its own kubelet serving certificate request for virtual node %s", m.cfg.NodeName),
		LastUpdateTime: metav1.Now(),
	})
	if _, err := m.cfg.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
		m.record(name, fmt.Sprintf("is pending: approving it failed (%v); %s", err, rbacHint))
		return err
	}
	m.record(name, "was approved by sandman-vk and has no certificate yet; "+signerHint)
	m.log.Info("approved own kubelet serving certificate request", "csr", name)
	return nil
}

func (m *Manager) record(name, state string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.requests[name]; !ok {
		m.order = append(m.order, name)
		if len(m.order) > keysKept {
			delete(m.requests, m.order[0])
			m.order = m.order[1:]
		}
	}
	m.requests[name] = state
}

// decided reports whether a request is no longer pending, and its state.
func decided(csr *certificatesv1.CertificateSigningRequest) (string, bool) {
	approved := false
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateDenied:
			return fmt.Sprintf("was denied (%s: %s)", c.Reason, c.Message), true
		case certificatesv1.CertificateFailed:
			return fmt.Sprintf("failed (%s: %s); %s", c.Reason, c.Message, signerHint), true
		case certificatesv1.CertificateApproved:
			approved = true
		}
	}
	switch {
	case approved && len(csr.Status.Certificate) > 0:
		return "was issued", true
	case approved:
		return "is approved and has no certificate yet; " + signerHint, true
	}
	return "", false
}

// expectation is what an approvable request looks like.
type expectation struct {
	username, node string
	ips            []net.IP
	keys           [][]byte
}

// ownKey reports whether the request's public key is one this process made.
func (e expectation) ownKey(csr *certificatesv1.CertificateSigningRequest) bool {
	req, err := parseRequest(csr.Spec.Request)
	if err != nil {
		return false
	}
	der, err := x509.MarshalPKIXPublicKey(req.PublicKey)
	if err != nil {
		return false
	}
	for _, k := range e.keys {
		if string(k) == string(der) {
			return true
		}
	}
	return false
}

// refusal says why a pending request is not approved, or "" to approve it.
func refusal(csr *certificatesv1.CertificateSigningRequest, e expectation) string {
	if csr.Spec.SignerName != SignerName {
		return fmt.Sprintf("signer %q is not %s", csr.Spec.SignerName, SignerName)
	}
	if csr.Spec.Username != e.username {
		return fmt.Sprintf("requested by %q, not by this sandman-vk (%q)", csr.Spec.Username, e.username)
	}
	req, err := parseRequest(csr.Spec.Request)
	if err != nil {
		return err.Error()
	}
	if want := "system:node:" + e.node; req.Subject.CommonName != want {
		return fmt.Sprintf("common name %q is not %q", req.Subject.CommonName, want)
	}
	if len(req.Subject.Organization) != 1 || req.Subject.Organization[0] != nodesGroup {
		return fmt.Sprintf("organization %q is not exactly [%s]", req.Subject.Organization, nodesGroup)
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return "email or URI subject alternative names are not allowed"
	}
	if len(req.DNSNames) == 0 && len(req.IPAddresses) == 0 {
		return "no subject alternative name"
	}
	for _, d := range req.DNSNames {
		if d != e.node {
			return fmt.Sprintf("DNS name %q is not the node's name %q", d, e.node)
		}
	}
	for _, ip := range req.IPAddresses {
		if !containsIP(e.ips, ip) {
			return fmt.Sprintf("IP address %s is not one of the node's (%s)", ip, ipList(e.ips))
		}
	}
	if why := checkUsages(csr.Spec.Usages); why != "" {
		return why
	}
	if !e.ownKey(csr) {
		return "its public key is not one this process generated (a request from an earlier run or another replica)"
	}
	return ""
}

// checkUsages accepts the two sets kube-controller-manager's kubelet-serving
// signer accepts: digital signature and server auth, with or without key
// encipherment.
func checkUsages(got []certificatesv1.KeyUsage) string {
	seen := map[certificatesv1.KeyUsage]bool{}
	for _, u := range got {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth:
			seen[u] = true
		default:
			return fmt.Sprintf("usage %q is not a kubelet serving usage", u)
		}
	}
	if !seen[certificatesv1.UsageDigitalSignature] || !seen[certificatesv1.UsageServerAuth] {
		return fmt.Sprintf("usages %q lack digital signature or server auth", got)
	}
	return ""
}

func parseRequest(pemBytes []byte) (*x509.CertificateRequest, error) {
	block, err := pemBlock(pemBytes)
	if err != nil {
		return nil, err
	}
	req, err := x509.ParseCertificateRequest(block)
	if err != nil {
		return nil, fmt.Errorf("unparsable certificate request: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature: %v", err)
	}
	return req, nil
}

func containsIP(ips []net.IP, ip net.IP) bool {
	for _, i := range ips {
		if i.Equal(ip) {
			return true
		}
	}
	return false
}

func ipList(ips []net.IP) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
