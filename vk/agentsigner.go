package vk

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
)

// AgentOwner is what makes a pod a node agent of this pool: it runs in
// Namespace, is controlled by the DaemonSet named DaemonSet (the object
// that exists now, by UID, not just its name) and runs as ServiceAccount.
// A label alone is not enough: anyone who can make a pod can give it one.
type AgentOwner struct {
	Namespace, DaemonSet, ServiceAccount string
}

// Check says why pod is not one of the DaemonSet's node agents ("": it
// is); err only when the apiserver could not answer.
func (o AgentOwner) Check(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) (string, error) {
	if pod.Namespace != o.Namespace {
		return fmt.Sprintf("pod %s/%s is not in namespace %s", pod.Namespace, pod.Name, o.Namespace), nil
	}
	if pod.Spec.ServiceAccountName != o.ServiceAccount {
		return fmt.Sprintf("pod %s/%s runs as ServiceAccount %q, not %q", pod.Namespace, pod.Name, pod.Spec.ServiceAccountName, o.ServiceAccount), nil
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "DaemonSet" || ref.Name != o.DaemonSet {
		return fmt.Sprintf("pod %s/%s is not controlled by DaemonSet %s/%s", pod.Namespace, pod.Name, o.Namespace, o.DaemonSet), nil
	}
	ds, err := client.AppsV1().DaemonSets(o.Namespace).Get(ctx, o.DaemonSet, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("DaemonSet %s/%s does not exist", o.Namespace, o.DaemonSet), nil
	}
	if err != nil {
		return "", fmt.Errorf("DaemonSet %s/%s: %w (sandman-vk needs get on daemonsets in %s)", o.Namespace, o.DaemonSet, err, o.Namespace)
	}
	if ds.UID != ref.UID {
		return fmt.Sprintf("pod %s/%s names DaemonSet %s/%s with UID %s as its controller, but that DaemonSet's UID is %s", pod.Namespace, pod.Name, o.Namespace, o.DaemonSet, ref.UID, ds.UID), nil
	}
	return "", nil
}

// Requester extra fields the apiserver sets for a pod's bound
// ServiceAccount token; a CSR carries its requester's in spec.extra.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// AgentSignerConfig configures an AgentSigner.
type AgentSignerConfig struct {
	Client kubernetes.Interface
	// CA is the CA that signs now (nodetls.Authority.Current: a rotation
	// changes it).
	CA    func() *nodetls.CA
	Owner AgentOwner
	// Lifetime caps the certificates' lifetime (default and cap:
	// nodetls.AgentLifetime; a request may ask for less).
	Lifetime time.Duration
	Logger   *slog.Logger
}

// AgentSigner approves and signs node agents' node API certificates
// (CSRs for signer nodetls.SignerName): only a request made with the bound
// ServiceAccount token of a running pod of the DaemonSet (AgentOwner),
// for exactly that pod's node name and addresses (nodetls.CheckAgentRequest).
// Anything else is denied with the reason, so the agent's log says it.
//
// RBAC: certificatesigningrequests get, list, watch; .../approval and
// .../status update; signers approve and sign (resourceName
// sandman.io/node-agent); pods and daemonsets get in the owner's namespace.
type AgentSigner struct {
	cfg   AgentSignerConfig
	log   *slog.Logger
	queue workqueue.TypedRateLimitingInterface[string]
}

// NewAgentSigner returns an AgentSigner; Run it.
func NewAgentSigner(cfg AgentSignerConfig) (*AgentSigner, error) {
	if cfg.Client == nil || cfg.CA == nil || cfg.Owner.DaemonSet == "" || cfg.Owner.ServiceAccount == "" || cfg.Owner.Namespace == "" {
		return nil, errors.New("agent signer: a client, the CA and the agents' namespace, DaemonSet and ServiceAccount are required")
	}
	if cfg.Lifetime <= 0 || cfg.Lifetime > nodetls.AgentLifetime {
		cfg.Lifetime = nodetls.AgentLifetime
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &AgentSigner{cfg: cfg, log: cfg.Logger.With("subsystem", "agent-signer"),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "sandman-agent-csr"})}, nil
}

// Run follows the signer's requests until ctx ends.
func (s *AgentSigner) Run(ctx context.Context) error {
	defer s.queue.ShutDown()
	csrs := s.cfg.Client.CertificatesV1().CertificateSigningRequests()
	sel := fields.OneTermEqualSelector("spec.signerName", nodetls.SignerName).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			o.FieldSelector = sel
			return csrs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return csrs.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, s.cfg.Client),
		&certificatesv1.CertificateSigningRequest{}, 0, cache.Indexers{})
	enqueue := func(obj any) {
		if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
			s.queue.Add(csr.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("watch certificatesigningrequests of signer %s: %w", nodetls.SignerName, ctx.Err())
	}
	wg.Go(func() {
		<-ctx.Done()
		s.queue.ShutDown()
	})
	for {
		name, quit := s.queue.Get()
		if quit {
			return nil
		}
		obj, exists, err := inf.GetIndexer().GetByKey(name)
		if err == nil && exists {
			err = s.process(ctx, obj.(*certificatesv1.CertificateSigningRequest))
		}
		if err != nil {
			s.log.Warn("node agent certificate request", "csr", name, "err", err)
			s.queue.AddRateLimited(name)
		} else {
			s.queue.Forget(name)
		}
		s.queue.Done(name)
	}
}

// process decides one request: deny with the reason, or approve and sign.
func (s *AgentSigner) process(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	if len(csr.Status.Certificate) > 0 {
		return nil
	}
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			return nil
		}
	}
	req, why, err := s.check(ctx, csr)
	if err != nil {
		return err // could not decide (apiserver); retried
	}
	csrs := s.cfg.Client.CertificatesV1().CertificateSigningRequests()
	if why != "" {
		s.log.Warn("denied a node agent certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", why)
		csr = csr.DeepCopy()
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "SandmanAgentCheck", Message: why})
		_, err := csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		return ignoreConflict(err)
	}
	if !approved(csr) {
		csr = csr.DeepCopy()
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "SandmanAgentCheck",
			Message: "requested by the node agent pod " + csr.Spec.Extra[extraPodName].String() + " of the DaemonSet, for its node"})
		if csr, err = csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return ignoreConflict(err)
		}
	}
	lifetime := s.cfg.Lifetime
	if e := csr.Spec.ExpirationSeconds; e != nil && time.Duration(*e)*time.Second < lifetime {
		lifetime = time.Duration(*e) * time.Second
	}
	chain, err := s.cfg.CA().SignAgent(req, lifetime)
	if err != nil {
		return err
	}
	csr = csr.DeepCopy()
	csr.Status.Certificate = chain
	if _, err := csrs.UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		return ignoreConflict(err)
	}
	s.log.Info("signed a node agent certificate", "csr", csr.Name, "agent", req.Subject.CommonName, "lifetime", lifetime.String())
	return nil
}

// check returns the parsed request, or why it is refused; err only when
// the apiserver could not answer.
func (s *AgentSigner) check(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (*x509.CertificateRequest, string, error) {
	o := s.cfg.Owner
	if want := "system:serviceaccount:" + o.Namespace + ":" + o.ServiceAccount; csr.Spec.Username != want {
		return nil, fmt.Sprintf("requested by %q: only %s (the sandman-node DaemonSet's pods) may ask", csr.Spec.Username, want), nil
	}
	podName, podUID := csr.Spec.Extra[extraPodName], csr.Spec.Extra[extraPodUID]
	if len(podName) != 1 || len(podUID) != 1 {
		return nil, "the requester's token is not bound to a pod (no " + extraPodName + " in the request): request it with the pod's projected ServiceAccount token", nil
	}
	pod, err := s.cfg.Client.CoreV1().Pods(o.Namespace).Get(ctx, podName[0], metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Sprintf("the requesting pod %s/%s is gone", o.Namespace, podName[0]), nil
	}
	if err != nil {
		return nil, "", err
	}
	if string(pod.UID) != podUID[0] {
		return nil, fmt.Sprintf("the requesting pod %s/%s (UID %s) is gone; a pod of that name has UID %s", o.Namespace, podName[0], podUID[0], pod.UID), nil
	}
	if pod.DeletionTimestamp != nil || pod.Spec.NodeName == "" {
		return nil, fmt.Sprintf("the requesting pod %s/%s is being deleted or not on a node", o.Namespace, pod.Name), nil
	}
	if why, err := o.Check(ctx, s.cfg.Client, pod); why != "" || err != nil {
		return nil, why, err
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, "the request is not a PEM CERTIFICATE REQUEST block", nil
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, "the request: " + err.Error(), nil
	}
	var ips []net.IP
	for _, a := range append([]corev1.HostIP{{IP: pod.Status.HostIP}}, pod.Status.HostIPs...) {
		if ip := net.ParseIP(a.IP); ip != nil {
			ips = append(ips, ip)
		}
	}
	for _, a := range pod.Status.PodIPs {
		if ip := net.ParseIP(a.IP); ip != nil {
			ips = append(ips, ip)
		}
	}
	if err := nodetls.CheckAgentRequest(req, pod.Spec.NodeName, ips); err != nil {
		return nil, err.Error(), nil
	}
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth:
		default:
			return nil, fmt.Sprintf("usage %q: a node agent certificate is for server auth only", u), nil
		}
	}
	return req, "", nil
}

func approved(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// ignoreConflict: another replica decided the request first; the watch
// brings its answer.
func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}
