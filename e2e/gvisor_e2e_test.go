//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
)

// ensureRuntimeClass makes RuntimeClass name with handler, unless it is
// there (the stack's gvisor one is; TestDeployed's uninstall may remove it).
func ensureRuntimeClass(t *testing.T, s *framework.Stack, name, handler string) {
	t.Helper()
	_, err := s.Kube.NodeV1().RuntimeClasses().Create(t.Context(),
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TestGVisorSandboxes: a pod with runtimeClassName gvisor becomes a sandbox
// under gVisor's kernel; kubectl exec reaches it as any pod; the attack
// suite fails from inside it as from a runc sandbox (the slot's firewall
// holds for gVisor's sockets); killing its own PID 1, which gVisor allows,
// ends that sandbox and nothing else; a fork bomb and a memory bomb harm
// their own sandbox and nothing else; and a RuntimeClass whose handler
// sandboxes do not run under fails its pod by name.
func TestGVisorSandboxes(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ensureRuntimeClass(t, s, "gvisor", runtime.RuntimeHandlerRunsc)
	ensureRuntimeClass(t, s, "sandman-e2e-kata", "kata-qemu")
	t.Cleanup(func() {
		_ = s.Kube.NodeV1().RuntimeClasses().Delete(context.Background(), "sandman-e2e-kata", metav1.DeleteOptions{})
	})
	p := startPool(t, s, 1, 4)
	ctx := t.Context()
	p.create(p.newPod("victim", s.DebianImage, func(pod *corev1.Pod) {
		pod.Spec.Containers[0].Command = []string{"python3", "-m", "http.server", "8080"}
		pod.Spec.Containers[0].Args = nil
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	}))
	p.create(p.newPod("guest", s.DebianImage, func(pod *corev1.Pod) {
		pod.Spec.RuntimeClassName = ptr.To("gvisor")
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}
	}))
	p.create(p.newPod("kata", s.BusyboxImage, func(pod *corev1.Pod) { pod.Spec.RuntimeClassName = ptr.To("sandman-e2e-kata") }))
	victim := p.waitPod("victim", 3*time.Minute, "Ready", podReady)
	guest := p.waitPod("guest", 3*time.Minute, "Ready", podReady)

	out, errOut, code := kubectl(t, s, "", "-n", p.ns, "exec", "guest", "--", "uname", "-r")
	if code != 0 || !strings.Contains(out, "gvisor") {
		t.Fatalf("kubectl exec guest -- uname -r: %q %q %d, want gVisor's kernel", out, errOut, code)
	}
	if out, _, _ := kubectl(t, s, "", "-n", p.ns, "exec", "victim", "--", "uname", "-r"); strings.Contains(out, "gvisor") {
		t.Fatalf("the runc pod runs on %q", out)
	}

	a := daemonAt(t, guest.Status.PodIP, trainerToken)
	// Everything but PID 1's signals: gVisor's kernel does not protect a
	// PID namespace's init from its members (below).
	runAttacks(t, s, p, a, victim, false)

	framework.Eventually(t, time.Minute, "the guest's daemon to serve after the attacks", func(ctx context.Context) (bool, error) {
		r, err := a.Exec(ctx, api.ExecRequest{Cmd: []string{"cat", "/proc/1/comm"}})
		return err == nil && strings.TrimSpace(string(r.Stdout)) == "sandman-daemon", nil
	})
	if r, err := daemonAt(t, victim.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Errorf("the victim after the attacks: %v", err)
	}

	// gVisor lets root in the sandbox SIGKILL its PID 1 (the daemon), which
	// Linux refuses: the sandbox ends, and only it. The pod fails, the
	// victim serves, and the slot takes the next gVisor pod.
	if _, err := a.Exec(ctx, api.ExecRequest{Cmd: []string{"python3", "-c", "import os; os.kill(1, 9)"}}); err == nil {
		t.Log("kill -KILL 1 returned before the daemon ended")
	}
	p.waitPod("guest", time.Minute, "to end", func(pod *corev1.Pod) bool {
		return pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
	})
	if r, err := daemonAt(t, victim.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Errorf("the victim after the guest killed its PID 1: %v", err)
	}
	p.create(p.newPod("guest-2", s.BusyboxImage, func(pod *corev1.Pod) { pod.Spec.RuntimeClassName = ptr.To("gvisor") }))
	guest2 := p.waitPod("guest-2", 2*time.Minute, "Ready after the first guest's end", podReady)

	// A fork bomb under gVisor runs into the pids limit (each guest
	// process is a host stub process of the Sentry's). gVisor either does
	// not survive it, and the sandbox ends, or survives it and serves
	// again once the bomb's processes are killed with its command (its
	// timeout): both happened on the same machine, the second about one
	// run in three. Either way it harms only itself, and a sandbox that
	// survived is released as any other.
	if _, err := daemonAt(t, guest2.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Shell: "b() { b | b & }; b", TimeoutSeconds: 10}); err != nil {
		t.Logf("fork bomb exec: %v", err)
	}
	outcome := endedOrServing(t, s, p, guest2, "its fork bomb", func(*corev1.Pod) error { return nil })
	t.Logf("the gVisor sandbox %s its fork bomb", outcome)
	if r, err := daemonAt(t, victim.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Errorf("the victim after the gVisor fork bomb: %v", err)
	}
	if outcome == "survived" {
		if err := s.Kube.CoreV1().Pods(p.ns).Delete(ctx, "guest-2", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		framework.Eventually(t, time.Minute, "guest-2's slot released after its delete", func(ctx context.Context) (bool, error) {
			_, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, "guest-2", metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}
	p.create(p.newPod("after", s.DebianImage, func(pod *corev1.Pod) {
		pod.Spec.RuntimeClassName = ptr.To("gvisor")
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}
	}))
	after := p.waitPod("after", 2*time.Minute, "a gVisor sandbox Ready after the fork bomb", podReady)

	// A memory bomb past the pod's limit: the Sentry and the guest's
	// processes share the pod's memory cgroup, and the node's OOM killer
	// picks by size, so either the bomb's process dies and the daemon
	// serves again, or the Sentry dies and the sandbox ends as OOMKilled
	// (gVisor's issue 2533). Either way only that sandbox is touched.
	if r, err := daemonAt(t, after.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"python3", "-c", "x = []\nwhile True: x.append(bytearray(16 << 20))"}, TimeoutSeconds: 60}); err == nil && r.ExitCode == 0 {
		t.Errorf("memory bomb: %+v, want killed", r)
	}
	outcome = endedOrServing(t, s, p, after, "its memory bomb", func(pod *corev1.Pod) error {
		var term *corev1.ContainerStateTerminated
		if len(pod.Status.ContainerStatuses) > 0 {
			term = pod.Status.ContainerStatuses[0].State.Terminated
		}
		if term == nil || term.Reason != runtime.ReasonOOMKilled {
			return fmt.Errorf("the memory bomb's sandbox ended %s (%+v), want OOMKilled", pod.Status.Phase, term)
		}
		return nil
	})
	t.Logf("the gVisor sandbox %s its memory bomb", outcome)
	if r, err := daemonAt(t, victim.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Errorf("the victim after the gVisor memory bomb: %v", err)
	}

	kata := p.waitPod("kata", time.Minute, "refused", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if kata.Status.Reason != runtime.ReasonInvalidSpec || !strings.Contains(kata.Status.Message, `"kata-qemu"`) {
		t.Errorf("a pod of RuntimeClass handler kata-qemu: %s %q, want InvalidSpec naming the handler", kata.Status.Reason, kata.Status.Message)
	}
}

// endedOrServing waits for sandbox pod, after what it did to itself, to end
// (ended says whether its end is one the test allows) or to serve again
// (its daemon answers exec as PID 1), and says which ("ended with" or
// "survived").
func endedOrServing(t *testing.T, s *framework.Stack, p *vpool, pod *corev1.Pod, what string, ended func(*corev1.Pod) error) string {
	t.Helper()
	c := daemonAt(t, pod.Status.PodIP, trainerToken)
	outcome := ""
	framework.Eventually(t, 2*time.Minute, pod.Name+" to end, or to serve again, after "+what, func(ctx context.Context) (bool, error) {
		cur, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if cur.Status.Phase == corev1.PodFailed || cur.Status.Phase == corev1.PodSucceeded {
			outcome = "ended with"
			return true, ended(cur)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := c.Exec(cctx, api.ExecRequest{Cmd: []string{"cat", "/proc/1/comm"}})
		if err == nil && strings.TrimSpace(string(r.Stdout)) == "sandman-daemon" {
			outcome = "survived"
			return true, nil
		}
		return false, nil
	})
	return outcome
}
