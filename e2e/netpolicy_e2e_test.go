//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
)

// probeLoop is an ordinary pod's command: every half second it tries the
// targets (host:port arguments) and prints one line, "N target=ok|blocked ...".
const probeLoop = `
import socket, sys, time
n = 0
while True:
    n += 1
    out = [str(n)]
    for t in sys.argv[1:]:
        h, p = t.rsplit(":", 1)
        try:
            socket.create_connection((h, int(p)), timeout=2).close()
            out.append(t + "=ok")
        except Exception:
            out.append(t + "=blocked")
    print(" ".join(out), flush=True)
    time.sleep(0.5)
`

// networkPolicy: the deployed agents enforce NetworkPolicies on sandbox
// slots. With none, pods of the sandbox's namespace reach it and pods of
// another namespace do not; a policy that selects the sandbox lets in what
// it allows (here: the other namespace, on the declared port only) and
// nothing else, applied to the running sandbox within seconds; deleting it
// restores the default.
func (d *deployed) networkPolicy(t *testing.T) {
	s := d.s
	ctx := t.Context()
	other := d.ns + "-other"
	if _, err := s.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other,
		Labels: map[string]string{"np-test": "other"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Kube.CoreV1().Namespaces().Delete(context.Background(), other, metav1.DeleteOptions{}) })
	s.NamespaceReady(t, other)

	// The sandbox serves on its declared port 8080.
	box := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "np-box", Namespace: d.ns, Labels: map[string]string{"app": "np-box"},
			Annotations: map[string]string{"sandman.io/token-sha256": trainerHash()}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"sandman.io/pool": deployPool},
			Tolerations:  []corev1.Toleration{{Key: "sandman.io/pool", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{Name: "task", Image: s.DebianImage, Command: []string{"python3", "-m", "http.server", "8080"},
				Ports:     []corev1.ContainerPort{{ContainerPort: 8080}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}}},
		},
	}
	if _, err := s.Kube.CoreV1().Pods(d.ns).Create(ctx, box, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 2*time.Minute, "np-box Ready", func(ctx context.Context) (bool, error) {
		p, err := s.Kube.CoreV1().Pods(d.ns).Get(ctx, "np-box", metav1.GetOptions{})
		box = p
		return err == nil && podReady(p) && p.Status.PodIP != "", nil
	})
	c, err := client.New(box.Status.PodIP+":49983", client.WithToken(trainerToken), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "np-box's server", func(ctx context.Context) (bool, error) {
		res, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8080), timeout=1)"}})
		return err == nil && res.ExitCode == 0, nil
	})

	daemon, web := box.Status.PodIP+":49983", box.Status.PodIP+":8080"
	probe := func(ns, name string) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName:                      d.worker,
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{Name: "probe", Image: s.DebianImage, Command: []string{"python3", "-u", "-c", probeLoop, daemon, web},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}}}},
			},
		}
		if _, err := s.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	probe(d.ns, "np-same")
	probe(other, "np-other")
	// expect waits until both probes' latest lines say what want says.
	expect := func(what string, want map[string]map[string]string) {
		t.Helper()
		var last string
		framework.Eventually(t, time.Minute, what, func(ctx context.Context) (bool, error) {
			ok := true
			last = ""
			for _, p := range []struct{ ns, name string }{{d.ns, "np-same"}, {other, "np-other"}} {
				b, err := s.Kube.CoreV1().Pods(p.ns).GetLogs(p.name, &corev1.PodLogOptions{TailLines: ptr.To[int64](1)}).DoRaw(ctx)
				line := strings.TrimSpace(string(b))
				last += fmt.Sprintf("%s: %q; ", p.name, line)
				if err != nil || line == "" {
					ok = false
					continue
				}
				for target, state := range want[p.name] {
					if !strings.Contains(line, target+"="+state) {
						ok = false
					}
				}
			}
			return ok, nil
		})
		t.Logf("%s: %s", what, last)
	}
	expect("by default, the sandbox's own namespace reaches it and another does not", map[string]map[string]string{
		"np-same":  {daemon: "ok", web: "ok"},
		"np-other": {daemon: "blocked", web: "blocked"},
	})

	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "np-box-ingress", Namespace: d.ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "np-box"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"np-test": "other"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(8080))}},
			}},
		},
	}
	if _, err := s.Kube.NetworkingV1().NetworkPolicies(d.ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a policy lets the other namespace in on port 8080 only, and nobody else", map[string]map[string]string{
		"np-same":  {daemon: "blocked", web: "blocked"},
		"np-other": {daemon: "blocked", web: "ok"},
	})
	// The trainer (this test, on the node) still manages the sandbox.
	if res, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("the sandbox's daemon under a policy, from the node: %v", err)
	}
	if err := s.Kube.NetworkingV1().NetworkPolicies(d.ns).Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("without the policy, the default again", map[string]map[string]string{
		"np-same":  {daemon: "ok", web: "ok"},
		"np-other": {daemon: "blocked", web: "blocked"},
	})
	for _, p := range []struct{ ns, name string }{{d.ns, "np-same"}, {other, "np-other"}, {d.ns, "np-box"}} {
		_ = s.Kube.CoreV1().Pods(p.ns).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
}
