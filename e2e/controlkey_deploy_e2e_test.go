//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
	"github.com/sandman-dev/sandman/vk"
)

// The control key Secret as deploy/base names it, and sandman-vk's metrics
// port there.
const (
	controlKeySecret = "sandman-control-key"
	vkMetricsPort    = 9655
)

// controlKeyRotation: an operator rotates the control key as
// docs/install.md says while kubectl exec keeps running against 10
// sandboxes. No exec fails; sandman-vk re-keys every sandbox (its gauge
// reaches 0, and the daemons take the new key's token and refuse the old
// one's); once control-key-previous is removed every sandbox still answers
// kubectl exec and its trainer's token, and a new sandbox answers too.
func (d *deployed) controlKeyRotation(t *testing.T) {
	ctx := t.Context()
	const n = 10
	var boxes []*corev1.Pod
	t.Cleanup(func() { d.deletePods(t, "rot-") })
	for i := range n {
		boxes = append(boxes, d.sandboxWith(t, fmt.Sprintf("rot-%d", i), smallSandbox, "sleep", "3600"))
	}
	oldKey := d.controlKey(t, "control-key")
	for _, b := range boxes {
		if err := d.kubectlExecHostname(b.Name); err != nil {
			t.Fatal(err)
		}
		if err := answers(ctx, b); err != nil {
			t.Fatalf("trainer's token: %v", err)
		}
		// The key in the Secret is the one sandman-vk gave the sandbox.
		if !takesToken(ctx, t, b, vk.ControlToken(oldKey, string(b.UID))) {
			t.Fatalf("sandbox %s does not take the token of the Secret's control key", b.Name)
		}
	}

	// kubectl exec through the apiserver, round after round, until the end.
	stop := make(chan struct{})
	var rounds atomic.Int64
	var failMu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for _, b := range boxes {
				select {
				case <-stop:
					return
				default:
				}
				if err := d.kubectlExecHostname(b.Name); err != nil {
					failMu.Lock()
					failures = append(failures, time.Now().Format(time.RFC3339Nano)+" "+err.Error())
					failMu.Unlock()
				}
			}
			rounds.Add(1)
		}
	})
	stopped := false
	stopExecs := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(stopExecs)
	waitRounds := func(what string, more int64) {
		t.Helper()
		from := rounds.Load()
		framework.Eventually(t, 2*time.Minute, what, func(context.Context) (bool, error) { return rounds.Load() >= from+more, nil })
	}
	waitRounds("a round of kubectl exec before the rotation", 1)

	// The rotation, as docs/install.md has it.
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	newKey := []byte(hex.EncodeToString(raw))
	oldB64 := d.kubectl(t, "-n", deployNS, "get", "secret", controlKeySecret, "-o", "jsonpath={.data.control-key}")
	d.kubectl(t, "-n", deployNS, "patch", "secret", controlKeySecret, "--type", "merge", "-p",
		fmt.Sprintf(`{"data":{"control-key":%q,"control-key-previous":%q}}`, base64.StdEncoding.EncodeToString(newKey), oldB64))
	start := time.Now()
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("sandman-vk metrics last read: %s", last)
		}
	}()
	framework.Eventually(t, 3*time.Minute, "sandman-vk holding the new key and every sandbox re-keyed (sandman_vk_sandboxes_on_previous_control_key 0)", func(ctx context.Context) (bool, error) {
		var ok bool
		ok, last = d.vkMetricsAll(ctx, map[string]float64{
			`sandman_vk_control_keys{key="previous"}`:      1,
			`sandman_vk_sandboxes_on_previous_control_key`: 0,
		})
		return ok, nil
	})
	t.Logf("re-keyed %d sandboxes in %v (%s)", n, time.Since(start).Round(time.Millisecond), last)
	for _, b := range boxes {
		switch {
		case takesToken(ctx, t, b, vk.ControlToken(oldKey, string(b.UID))):
			t.Errorf("sandbox %s still takes the old key's token", b.Name)
		case !takesToken(ctx, t, b, vk.ControlToken(newKey, string(b.UID))):
			t.Errorf("sandbox %s does not take the new key's token", b.Name)
		}
	}
	waitRounds("a round of kubectl exec after the re-key", 1)

	// The previous key goes.
	d.kubectl(t, "-n", deployNS, "patch", "secret", controlKeySecret, "--type", "json", "-p",
		`[{"op":"remove","path":"/data/control-key-previous"}]`)
	framework.Eventually(t, 2*time.Minute, "sandman-vk without a previous key", func(ctx context.Context) (bool, error) {
		ok, _ := d.vkMetricsAll(ctx, map[string]float64{`sandman_vk_control_keys{key="previous"}`: 0})
		return ok, nil
	})
	// Two more rounds: at least one ran entirely without the old key.
	waitRounds("two rounds of kubectl exec without the previous key", 2)

	// The node API's CA rotates too, with the same sandboxes answering.
	d.rotateNodeAPICA(t)
	waitRounds("a round of kubectl exec after the CA rotation", 1)
	stopExecs()
	if got := d.controlKey(t, "control-key"); string(got) != string(newKey) {
		t.Fatalf("the Secret's control-key is %q, want the new key", got)
	}
	for _, b := range boxes {
		if err := d.kubectlExecHostname(b.Name); err != nil {
			t.Error(err)
		}
		if err := answers(ctx, b); err != nil {
			t.Errorf("trainer's token after the rotation: %v", err)
		}
	}
	fresh := d.sandboxWith(t, "rot-new", smallSandbox, "sleep", "3600")
	if err := d.kubectlExecHostname(fresh.Name); err != nil {
		t.Error(err)
	}
	if !takesToken(ctx, t, fresh, vk.ControlToken(newKey, string(fresh.UID))) || takesToken(ctx, t, fresh, vk.ControlToken(oldKey, string(fresh.UID))) {
		t.Error("a sandbox made after the rotation: want the new key's token only")
	}
	failMu.Lock()
	defer failMu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d kubectl exec calls failed during the rotation (%d rounds of %d), first ones:\n%s",
			len(failures), rounds.Load(), n, strings.Join(failures[:min(len(failures), 5)], "\n"))
	}
	t.Logf("%d rounds of kubectl exec on %d sandboxes, none failed", rounds.Load(), n)
}

// kubectlExecHostname runs hostname in a sandbox through kubectl exec (the
// apiserver, then sandman-vk's kubelet port, then the daemon with the
// control token).
func (d *deployed) kubectlExecHostname(pod string) error {
	out, err := d.kubectlBackground(time.Minute, "-n", d.ns, "exec", pod, "--", "hostname")
	if err != nil || out != pod+"\n" {
		return fmt.Errorf("kubectl exec %s -- hostname: %q, %v", pod, out, err)
	}
	return nil
}

// controlKey reads one key of the control key Secret.
func (d *deployed) controlKey(t *testing.T, key string) []byte {
	t.Helper()
	s, err := d.s.Kube.CoreV1().Secrets(deployNS).Get(t.Context(), controlKeySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := []byte(strings.TrimSpace(string(s.Data[key])))
	if len(v) == 0 {
		t.Fatalf("secret %s/%s has no %q", deployNS, controlKeySecret, key)
	}
	return v
}

// takesToken says whether a sandbox's daemon takes tok: health answers its
// version only to a token it takes.
func takesToken(ctx context.Context, t *testing.T, pod *corev1.Pod, tok string) bool {
	t.Helper()
	c, err := client.New(pod.Status.PodIP+":49983", client.WithToken(tok))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, err := c.Health(ctx)
	if err != nil {
		t.Fatalf("health of sandbox %s: %v", pod.Name, err)
	}
	return h.Version != ""
}

// vkMetricsAll scrapes every sandman-vk replica's metrics (host network:
// the worker's address) and says whether each has every series at its
// wanted value, with what it read.
func (d *deployed) vkMetricsAll(ctx context.Context, want map[string]float64) (bool, string) {
	pods, err := d.s.Kube.CoreV1().Pods(deployNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandman-vk"})
	if err != nil || len(pods.Items) == 0 {
		return false, fmt.Sprintf("sandman-vk pods: %d, %v", len(pods.Items), err)
	}
	var seen []string
	ok := true
	for _, p := range pods.Items {
		if p.Status.HostIP == "" || p.DeletionTimestamp != nil {
			return false, p.Name + " has no address yet"
		}
		text, err := scrape(ctx, "http://"+net.JoinHostPort(p.Status.HostIP, strconv.Itoa(vkMetricsPort))+"/metrics")
		if err != nil {
			return false, fmt.Sprintf("%s: %v", p.Name, err)
		}
		for series, v := range want {
			got, found := metricSeries(text, series)
			seen = append(seen, fmt.Sprintf("%s %s=%v", p.Name, series, got))
			if !found || got != v {
				ok = false
			}
		}
	}
	return ok, strings.Join(seen, ", ")
}

// metricSeries reads one series ("name" or `name{labels}`, as exposed)
// from Prometheus text.
func metricSeries(text, series string) (float64, bool) {
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// deletePods deletes the trainer namespace's pods named with prefix and
// waits until they are gone.
func (d *deployed) deletePods(t *testing.T, prefix string) {
	ctx := context.Background()
	pods := d.s.Kube.CoreV1().Pods(d.ns)
	l, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("list pods: %v", err)
		return
	}
	var names []string
	for _, p := range l.Items {
		if strings.HasPrefix(p.Name, prefix) {
			names = append(names, p.Name)
			if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s: %v", p.Name, err)
			}
		}
	}
	for _, name := range names {
		framework.Eventually(t, 2*time.Minute, "pod "+name+" gone", func(ctx context.Context) (bool, error) {
			_, err := pods.Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}
}

// smallSandbox requests 10m CPU: the local pool's share of the worker is one
// core, and 10 sandboxes of the default 100m would fill it.
func smallSandbox(p *corev1.Pod) {
	p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("10m")
}

// rotateNodeAPICA replaces the node API's CA as docs/install.md says: the
// new CA with the old one as previous (agents certified by the old one are
// still reached: a sandbox binds), the agent restarted (its new certificate
// is from the new CA, and sandboxes keep running), the previous CA dropped (a
// sandbox binds again).
func (d *deployed) rotateNodeAPICA(t *testing.T) {
	ctx := t.Context()
	secrets := d.s.Kube.CoreV1().Secrets(deployNS)
	sec, err := secrets.Get(ctx, "sandman-node-api-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := nodetls.NewCA(deployPool)
	if err != nil {
		t.Fatal(err)
	}
	changes := func() int {
		logs, err := d.vkLogs(ctx)
		if err != nil {
			return -1
		}
		return strings.Count(logs, "node API CA changed")
	}
	before := changes()
	sec.Data["previous.crt"], sec.Data["previous.key"] = sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey] = newCA.CertPEM, newCA.KeyPEM
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "sandman-vk taking the new node API CA", func(context.Context) (bool, error) {
		return changes() > before, nil
	})
	agent := d.waitAgentReady(t, "", time.Minute)
	if issuer := d.agentCertIssuer(t, agent); issuer == newCA.Cert.Subject.CommonName {
		t.Fatalf("the agent already has a certificate from the new CA before its restart")
	}
	during := d.sandboxWith(t, "rot-ca-during", smallSandbox, "sleep", "3600")
	if err := d.kubectlExecHostname(during.Name); err != nil {
		t.Fatal(err)
	}

	// A new agent pod asks for its certificate: now from the new CA.
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e.sandman.io/restarted-at":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := d.s.Kube.AppsV1().DaemonSets(deployNS).Patch(ctx, "sandman-node", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var restarted *corev1.Pod
	framework.Eventually(t, 3*time.Minute, "the restarted agent serving a certificate from the new CA", func(ctx context.Context) (bool, error) {
		p, err := d.agentPod(ctx)
		if err != nil || p == nil || p.UID == agent.UID || !podReady(p) {
			return false, nil
		}
		restarted = p
		return d.agentCertIssuer(t, p) == newCA.Cert.Subject.CommonName, nil
	})
	if err := d.kubectlExecHostname(during.Name); err != nil {
		t.Errorf("a sandbox bound before the agent's restart: %v", err)
	}

	// The old CA goes.
	before = changes()
	sec, err = secrets.Get(ctx, "sandman-node-api-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(sec.Data, "previous.crt")
	delete(sec.Data, "previous.key")
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "sandman-vk dropping the previous node API CA", func(context.Context) (bool, error) {
		return changes() > before, nil
	})
	after := d.sandboxWith(t, "rot-ca-after", smallSandbox, "sleep", "3600")
	if err := d.kubectlExecHostname(after.Name); err != nil {
		t.Error(err)
	}
	t.Logf("node API CA rotated: agent %s now certified by %q", restarted.Name, newCA.Cert.Subject.CommonName)
}

// agentCertIssuer is the common name of the CA that issued the agent's
// node API certificate ("" when it cannot be read).
func (d *deployed) agentCertIssuer(t *testing.T, agent *corev1.Pod) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(agent.Status.HostIP, "9651"),
		&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) //nolint:gosec // reads the certificate, trusts nothing
	if err != nil {
		return ""
	}
	defer conn.Close()
	if pc := conn.ConnectionState().PeerCertificates; len(pc) > 0 {
		return pc[0].Issuer.CommonName
	}
	return ""
}
