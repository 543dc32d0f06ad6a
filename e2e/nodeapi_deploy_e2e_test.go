//go:build e2e

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
)

// fakeAgentIgnored: a pod with the node agents' label and ServiceAccount on
// the worker, but not controlled by the DaemonSet, is never used as the
// worker's agent (sandman-vk logs why), and sandboxes keep landing on the
// real one.
func (d *deployed) fakeAgentIgnored(t *testing.T) {
	ctx := t.Context()
	pods := d.s.Kube.CoreV1().Pods(deployNS)
	// Another workload's pod with the agents' label and ServiceAccount: a
	// ReplicaSet's (a pod without a controller would be adopted by the
	// DaemonSet, which then deletes it as a second pod on the worker).
	labels := map[string]string{"app.kubernetes.io/name": "sandman-node", "e2e": "fake-agent"}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "fake-sandman-node", Namespace: deployNS},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:           d.worker,
					ServiceAccountName: "sandman-node",
					Containers: []corev1.Container{{Name: "agent", Image: d.s.BusyboxImage,
						Command: []string{"sh", "-c", "exec sleep 3600"}}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				},
			},
		},
	}
	if _, err := d.s.Kube.AppsV1().ReplicaSets(deployNS).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.s.Kube.AppsV1().ReplicaSets(deployNS).Delete(context.Background(), rs.Name,
			metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
	var fake *corev1.Pod
	framework.Eventually(t, 2*time.Minute, "the fake agent pod Running with an IP", func(ctx context.Context) (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "e2e=fake-agent"})
		if err != nil || len(l.Items) != 1 {
			return false, nil
		}
		fake = &l.Items[0]
		return fake.Status.Phase == corev1.PodRunning && fake.Status.PodIP != "", nil
	})
	framework.Eventually(t, time.Minute, "sandman-vk's log saying it ignores the fake agent pod", func(ctx context.Context) (bool, error) {
		logs, err := d.vkLogs(ctx)
		return err == nil && strings.Contains(logs, "not a node agent of this pool") && strings.Contains(logs, fake.Name) &&
			strings.Contains(logs, "is not controlled by DaemonSet"), nil
	})
	box := d.sandbox(t, "after-fake-agent", "sleep", "3600")
	if err := answers(ctx, box); err != nil {
		t.Fatal(err)
	}
	if out := d.kubectl(t, "-n", d.ns, "exec", box.Name, "--", "hostname"); out != box.Name+"\n" {
		t.Fatalf("kubectl exec: %q", out)
	}
	logs, err := d.vkLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs, `"addr":"`+net.JoinHostPort(fake.Status.PodIP, "9651")+`"`) {
		t.Errorf("sandman-vk followed the fake agent pod at %s", fake.Status.PodIP)
	}
	_ = d.s.Kube.CoreV1().Pods(d.ns).Delete(ctx, box.Name, metav1.DeleteOptions{})
}

// vkLogs is the log of every sandman-vk pod.
func (d *deployed) vkLogs(ctx context.Context) (string, error) {
	l, err := d.s.Kube.CoreV1().Pods(deployNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandman-vk"})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, p := range l.Items {
		out, err := d.s.Kube.CoreV1().Pods(deployNS).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return "", err
		}
		b.Write(out)
	}
	return b.String(), nil
}

// nodeAPIMutualTLS: the node API takes only sandman-vk's certificate. No
// certificate, the agent's own ServiceAccount token, or a genuine node agent
// certificate (requested as the agent pod, exactly as the agent does, and
// signed by sandman-vk) get nothing; a certificate request from anyone but
// an agent pod of the DaemonSet is denied with the reason.
func (d *deployed) nodeAPIMutualTLS(t *testing.T) {
	ctx := t.Context()
	agent := d.waitAgentReady(t, "", 2*time.Minute)
	addr := net.JoinHostPort(agent.Status.HostIP, "9651")

	// The agent's credentials, as a sandbox that escaped to the worker
	// could take them: a token of its ServiceAccount bound to its pod.
	agentToken := d.boundToken(t, "sandman-node", agent)

	call := func(cert *tls.Certificate, bearer string) (int, string, error) {
		cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // the test attacks the server; it does not trust it
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/v1/inventory", nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := call(nil, ""); err != nil || code != http.StatusUnauthorized || !strings.Contains(body, "control plane") {
		t.Errorf("no credentials: %d %q %v, want 401 naming the control plane's certificate", code, body, err)
	}
	if code, body, err := call(nil, agentToken); err != nil || code != http.StatusUnauthorized {
		t.Errorf("the agent's ServiceAccount token: %d %q %v, want 401", code, body, err)
	}
	// Plain HTTP: nothing answers the API.
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/v1/inventory"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP: status %d, want 400 (TLS only)", resp.StatusCode)
		}
	}

	// A genuine agent certificate, asked for as the agent pod.
	agentClient := d.clientWithToken(t, agentToken)
	cert, denied := requestAgentCert(t, agentClient, agent.Spec.NodeName, net.ParseIP(agent.Status.HostIP))
	if denied != "" {
		t.Fatalf("the agent pod's own request was denied: %s", denied)
	}
	if code, body, err := call(cert, ""); err == nil {
		t.Errorf("a node agent's certificate as the caller: %d %q, want the TLS handshake refused", code, body)
	}
	// The same pod asking for another node's name: denied.
	if _, denied := requestAgentCert(t, agentClient, "another-worker", net.ParseIP(agent.Status.HostIP)); !strings.Contains(denied, "common name") {
		t.Errorf("a request for another node: denied = %q, want the common name refused", denied)
	}
	// Another ServiceAccount of the namespace (sandman-vk's own, whose
	// pods are no agents): denied.
	vkPods, err := d.s.Kube.CoreV1().Pods(deployNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandman-vk"})
	if err != nil || len(vkPods.Items) == 0 {
		t.Fatalf("sandman-vk pods: %v", err)
	}
	other := d.clientWithToken(t, d.boundToken(t, "sandman-vk", &vkPods.Items[0]))
	if _, denied := requestAgentCert(t, other, agent.Spec.NodeName, net.ParseIP(agent.Status.HostIP)); !strings.Contains(denied, "only system:serviceaccount:"+deployNS+":sandman-node") {
		t.Errorf("a request by sandman-vk's ServiceAccount: denied = %q, want refused as not the agents'", denied)
	}
}

// boundToken makes a token of the ServiceAccount bound to pod, as the
// kubelet gives the pod.
func (d *deployed) boundToken(t *testing.T, sa string, pod *corev1.Pod) string {
	t.Helper()
	tr, err := d.s.Kube.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(t.Context(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// clientWithToken is a client of the stack's apiserver as the token's owner.
func (d *deployed) clientWithToken(t *testing.T, token string) kubernetes.Interface {
	t.Helper()
	cfg := rest.AnonymousClientConfig(d.s.RESTConfig)
	cfg.BearerToken = token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// requestAgentCert asks for a node agent certificate for node at ip as the
// client's user, as the agent's certificate manager does, and waits for
// sandman-vk's answer: the certificate, or why it was denied.
func requestAgentCert(t *testing.T, c kubernetes.Interface, node string, ip net.IP) (*tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: nodetls.AgentCN(node)}, DNSNames: []string{node}, IPAddresses: []net.IP{ip}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrs := c.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Create(t.Context(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-agent-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: nodetls.SignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var chain []byte
	var denied string
	framework.Eventually(t, time.Minute, "sandman-vk's answer to "+csr.Name, func(ctx context.Context) (bool, error) {
		got, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == certificatesv1.CertificateDenied {
				denied = fmt.Sprintf("%s: %s", c.Reason, c.Message)
				return true, nil
			}
		}
		chain = got.Status.Certificate
		return len(chain) > 0, nil
	})
	if denied != "" {
		return nil, denied
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(chain, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return &cert, ""
}
