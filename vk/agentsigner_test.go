package vk

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
)

// TestAgentSigner: only a pod the DaemonSet controls, running as the
// agents' ServiceAccount, gets a certificate, and only for its own node.
func TestAgentSigner(t *testing.T) {
	const ns = "sandman-system"
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "sandman-node", Namespace: ns, UID: "ds-uid"}}
	agentPod := func(name, uid string, owner *metav1.OwnerReference, sa string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(uid)},
			Spec:       corev1.PodSpec{NodeName: "w1", ServiceAccountName: sa},
			Status:     corev1.PodStatus{HostIP: "10.0.0.1", PodIP: "10.0.0.1", Phase: corev1.PodRunning},
		}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return p
	}
	ctrl := func(kind, name, uid string) *metav1.OwnerReference {
		return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}
	}
	client := fake.NewClientset(ds,
		agentPod("agent", "agent-uid", ctrl("DaemonSet", "sandman-node", "ds-uid"), "sandman-node"),
		agentPod("orphan", "orphan-uid", nil, "sandman-node"),
		agentPod("other-rs", "rs-pod-uid", ctrl("ReplicaSet", "x", "rs-uid"), "sandman-node"),
		agentPod("forged", "forged-uid", ctrl("DaemonSet", "sandman-node", "old-ds-uid"), "sandman-node"),
		agentPod("other-sa", "sa-uid", ctrl("DaemonSet", "sandman-node", "ds-uid"), "default"),
	)
	ca, err := nodetls.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewAgentSigner(AgentSignerConfig{Client: client, CA: func() *nodetls.CA { return ca },
		Owner: AgentOwner{Namespace: ns, DaemonSet: "sandman-node", ServiceAccount: "sandman-node"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	agentSA := "system:serviceaccount:" + ns + ":sandman-node"
	for _, tc := range []struct {
		name, user, pod, uid, node string
		ip                         net.IP
		want                       string // "" signed, else in the Denied message
	}{
		{"the agent", agentSA, "agent", "agent-uid", "w1", net.IPv4(10, 0, 0, 1), ""},
		{"another node's name", agentSA, "agent", "agent-uid", "w2", net.IPv4(10, 0, 0, 1), "common name"},
		{"another address", agentSA, "agent", "agent-uid", "w1", net.IPv4(10, 0, 0, 9), "10.0.0.9"},
		{"a recreated pod's name", agentSA, "agent", "old-uid", "w1", net.IPv4(10, 0, 0, 1), "is gone"},
		{"a pod without a controller", agentSA, "orphan", "orphan-uid", "w1", net.IPv4(10, 0, 0, 1), "not controlled by DaemonSet"},
		{"another workload's pod", agentSA, "other-rs", "rs-pod-uid", "w1", net.IPv4(10, 0, 0, 1), "not controlled by DaemonSet"},
		{"a controller reference to an older DaemonSet", agentSA, "forged", "forged-uid", "w1", net.IPv4(10, 0, 0, 1), "UID is ds-uid"},
		{"another ServiceAccount on the pod", agentSA, "other-sa", "sa-uid", "w1", net.IPv4(10, 0, 0, 1), "runs as ServiceAccount"},
		{"another requester", "system:serviceaccount:" + ns + ":default", "agent", "agent-uid", "w1", net.IPv4(10, 0, 0, 1), "only " + agentSA},
		{"a token not bound to a pod", agentSA, "", "", "w1", net.IPv4(10, 0, 0, 1), "not bound to a pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
				Subject: pkix.Name{CommonName: nodetls.AgentCN(tc.node)}, DNSNames: []string{tc.node}, IPAddresses: []net.IP{tc.ip}}, key)
			if err != nil {
				t.Fatal(err)
			}
			extra := map[string]certificatesv1.ExtraValue{}
			if tc.pod != "" {
				extra[extraPodName] = certificatesv1.ExtraValue{tc.pod}
				extra[extraPodUID] = certificatesv1.ExtraValue{tc.uid}
			}
			name := strings.ReplaceAll(tc.name, " ", "-")
			name = strings.ReplaceAll(name, "'", "")
			_, err = client.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: certificatesv1.CertificateSigningRequestSpec{
					Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
					SignerName: nodetls.SignerName, Username: tc.user, Extra: extra,
					Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var got *certificatesv1.CertificateSigningRequest
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err = client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
				return err == nil && (len(got.Status.Certificate) > 0 || condition(got, certificatesv1.CertificateDenied) != nil), nil
			}); err != nil {
				t.Fatalf("no decision: %v", err)
			}
			denied := condition(got, certificatesv1.CertificateDenied)
			switch {
			case tc.want == "" && denied != nil:
				t.Fatalf("denied: %s", denied.Message)
			case tc.want == "":
				block, _ := pem.Decode(got.Status.Certificate)
				cert, err := x509.ParseCertificate(block.Bytes)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "w1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					t.Errorf("the certificate: %v", err)
				}
				if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
					t.Error("the agent's certificate is good for client auth")
				}
				if condition(got, certificatesv1.CertificateApproved) == nil {
					t.Error("signed without the Approved condition")
				}
			case denied == nil:
				t.Fatalf("signed, want denied with %q", tc.want)
			case !strings.Contains(denied.Message, tc.want):
				t.Fatalf("denied with %q, want %q in it", denied.Message, tc.want)
			}
		})
	}
}

func condition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i, c := range csr.Status.Conditions {
		if c.Type == typ {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}
