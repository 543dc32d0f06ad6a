//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/sandman-dev/sandman/e2e/framework"
)

// TestVKKubeletPortAuthz: the virtual node's kubelet port authorizes like a
// kubelet. For exec, logs and stats, straight to the port:
// anonymous → 401; an unprivileged ServiceAccount's token → 403; a
// ServiceAccount with nodes/proxy on the node → exec and logs work, stats
// (nodes/stats) does not; the apiserver's kubelet client certificate → all
// three; another node's certificate (system:node:<worker>) → what a
// SubjectAccessReview gives it, never exec or logs. And through the apiserver
// (its client, as a user with pods/exec sees it): kubectl exec, kubectl logs,
// the node proxy's stats.
func TestVKKubeletPortAuthz(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 2)
	ctx := t.Context()
	p.create(p.newPod("box", s.BusyboxImage, func(pod *corev1.Pod) {
		pod.Spec.Containers[0].Command = []string{"sh", "-c", "echo hello-authz; exec sleep 3600"}
	}))
	p.waitPod("box", 2*time.Minute, "Ready", podReady)
	addr := p.kubeletAddr()
	pki := s.Env["PKI"]
	base := func() *rest.Config {
		return &rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(pki, "ca.crt")}, Timeout: 30 * time.Second}
	}

	// Identities.
	anonymous := base()
	nobody := base()
	nobody.BearerToken = p.serviceAccountToken("nobody")
	prober := base()
	prober.BearerToken = p.serviceAccountToken("prober")
	p.grantNodeProxy("system:serviceaccount:" + p.ns + ":prober")
	apiserverClient := base()
	apiserverClient.CertFile, apiserverClient.KeyFile = filepath.Join(pki, "apiserver-kubelet-client.crt"), filepath.Join(pki, "apiserver-kubelet-client.key")
	otherNode := base()
	otherNode.CertFile, otherNode.KeyFile = filepath.Join(pki, "kubelet.crt"), filepath.Join(pki, "kubelet.key")

	execPath := "/exec/" + p.ns + "/box/task?command=echo&command=hi&output=1&error=1"
	logsPath := "/containerLogs/" + p.ns + "/box/task"
	statsPath := "/stats/summary"

	// Refused: the status, before any handler runs.
	for _, tc := range []struct {
		who, method, path string
		cfg               *rest.Config
		status            int
		body              string
	}{
		{"anonymous", "POST", execPath, anonymous, 401, "Unauthorized"},
		{"anonymous", "GET", logsPath, anonymous, 401, "Unauthorized"},
		{"anonymous", "GET", statsPath, anonymous, 401, "Unauthorized"},
		{"nobody", "POST", execPath, nobody, 403, "Forbidden (user=system:serviceaccount:" + p.ns + ":nobody, verb=create, resource=nodes, subresource(s)=[proxy])"},
		{"nobody", "GET", logsPath, nobody, 403, "Forbidden (user=system:serviceaccount:" + p.ns + ":nobody, verb=get, resource=nodes, subresource(s)=[proxy])"},
		{"nobody", "GET", statsPath, nobody, 403, "Forbidden (user=system:serviceaccount:" + p.ns + ":nobody, verb=get, resource=nodes, subresource(s)=[stats])"},
		// nodes/proxy is not nodes/stats, as on a kubelet.
		{"prober", "GET", statsPath, prober, 403, "subresource(s)=[stats]"},
	} {
		status, body := kubeletCall(t, tc.cfg, tc.method, tc.path)
		if status != tc.status || !strings.Contains(body, tc.body) {
			t.Errorf("%s %s %s: %d %q, want %d %q", tc.who, tc.method, tc.path, status, body, tc.status, tc.body)
		}
	}

	// Allowed: the sandbox answers.
	for _, who := range []struct {
		name  string
		cfg   *rest.Config
		stats bool
	}{{"prober (nodes/proxy)", prober, false}, {"the apiserver's kubelet client", apiserverClient, true}} {
		if out, err := kubeletExec(ctx, who.cfg, execPath); err != nil || out != "hi\n" {
			t.Errorf("%s: exec: %q %v", who.name, out, err)
		}
		if status, body := kubeletCall(t, who.cfg, "GET", logsPath); status != 200 || !strings.Contains(body, "hello-authz") {
			t.Errorf("%s: logs: %d %q", who.name, status, body)
		}
		if who.stats {
			if status, body := kubeletCall(t, who.cfg, "GET", statsPath); status != 200 || !strings.Contains(body, `"box"`) {
				t.Errorf("%s: stats: %d %.200q", who.name, status, body)
			}
		}
	}

	// Another node's certificate gets what the Node authorizer (and RBAC)
	// give system:node:<worker> on this node, and never exec or logs.
	worker := "system:node:" + s.Env["WORKER_NAME"]
	for _, c := range []struct{ verb, subresource, method, path string }{
		{"create", "proxy", "POST", execPath}, {"get", "proxy", "GET", logsPath}, {"get", "stats", "GET", statsPath},
	} {
		sar, err := s.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: worker, Groups: []string{"system:nodes", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Version: "v1", Resource: "nodes", Subresource: c.subresource, Name: p.node},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.subresource == "proxy" && sar.Status.Allowed {
			t.Fatalf("the stack allows %s %s nodes/proxy of %s: the test's premise is wrong", worker, c.verb, p.node)
		}
		status, body := kubeletCall(t, otherNode, c.method, c.path)
		if got := status != 401 && status != 403; got != sar.Status.Allowed {
			t.Errorf("%s %s %s: %d %q; a SubjectAccessReview allows it: %v", worker, c.method, c.path, status, body, sar.Status.Allowed)
		}
		if status == 401 {
			t.Errorf("%s: its certificate did not authenticate: %q", worker, body)
		}
	}

	// Through the apiserver: kubectl exec and logs (pods/exec, pods/log at
	// the apiserver; the apiserver's kubelet client at the port), stats
	// through the node proxy.
	ns := []string{"-n", p.ns}
	if out, errOut, code := kubectl(t, s, "", append(ns, "exec", "box", "--", "echo", "through the apiserver")...); code != 0 || out != "through the apiserver\n" {
		t.Errorf("kubectl exec: %d %q %q", code, out, errOut)
	}
	if out, errOut, code := kubectl(t, s, "", append(ns, "logs", "box")...); code != 0 || !strings.Contains(out, "hello-authz") {
		t.Errorf("kubectl logs: %d %q %q", code, out, errOut)
	}
	if raw, err := s.Kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", p.node, "proxy", "stats", "summary").DoRaw(ctx); err != nil || !strings.Contains(string(raw), `"box"`) {
		t.Errorf("stats through the node proxy: %v %.200q", err, raw)
	}
}

// kubeletAddr is sandman-vk's --kubelet-listen.
func (p *vpool) kubeletAddr() string {
	p.t.Helper()
	for i, a := range p.vkArgs {
		if a == "--kubelet-listen" && i+1 < len(p.vkArgs) {
			return p.vkArgs[i+1]
		}
	}
	p.t.Fatal("sandman-vk runs without --kubelet-listen")
	return ""
}

// serviceAccountToken creates a ServiceAccount in the pool's namespace and
// returns a token of it (10 minutes).
func (p *vpool) serviceAccountToken(name string) string {
	p.t.Helper()
	ctx := p.t.Context()
	if _, err := p.s.Kube.CoreV1().ServiceAccounts(p.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
	exp := int64(600)
	tr, err := p.s.Kube.CoreV1().ServiceAccounts(p.ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	return tr.Status.Token
}

// grantNodeProxy gives a ServiceAccount user (system:serviceaccount:ns:name)
// get and create on nodes/proxy of the pool's virtual node, and waits until
// the apiserver says so (sandman-vk keeps a refusal for 30 s).
func (p *vpool) grantNodeProxy(user string) {
	p.t.Helper()
	ctx := p.t.Context()
	name := "e2e-kubelet-proxy-" + p.node
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, ResourceNames: []string{p.node}, Verbs: []string{"get", "create"},
	}}}
	if _, err := p.s.Kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
	parts := strings.Split(user, ":")
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: parts[2], Name: parts[3]}}}
	if _, err := p.s.Kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() {
		ctx := context.Background()
		_ = p.s.Kube.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = p.s.Kube.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	framework.Eventually(p.t, 30*time.Second, user+" to hold nodes/proxy of "+p.node, func(ctx context.Context) (bool, error) {
		sar, err := p.s.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + parts[2], "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "create", Version: "v1", Resource: "nodes", Subresource: "proxy", Name: p.node},
		}}, metav1.CreateOptions{})
		return err == nil && sar.Status.Allowed, nil
	})
}

// kubeletCall makes one request on the kubelet port as cfg's identity and
// returns the status and body.
func kubeletCall(t *testing.T, cfg *rest.Config, method, path string) (int, string) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, cfg.Host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// kubeletExec runs an exec (SPDY, as the apiserver speaks to kubelets)
// on the kubelet port as cfg's identity and returns its stdout.
func kubeletExec(ctx context.Context, cfg *rest.Config, path string) (string, error) {
	u, err := url.Parse(cfg.Host + path)
	if err != nil {
		return "", err
	}
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	return out.String(), err
}
