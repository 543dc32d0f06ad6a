//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
)

// TestVKFailover: two sandman-vk replicas of one virtual node, one leading
// through the Lease. The leader is killed (SIGKILL) in the middle of a
// 200-pod burst: the standby leads within 15 s, every pod of the burst
// becomes Ready, none is bound twice (bound slots = Running pods, each pod
// once), sandboxes bound before the kill keep their address and their files,
// and kubectl exec works again within 20 s of the kill. Then the new leader
// is stopped gracefully (SIGTERM): it releases the Lease and a restarted
// replica leads within a few seconds.
func TestVKFailover(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 2, 110)
	ctx := t.Context()
	p.killVK()
	lease := "sandman-vk-" + p.node
	replica := func() *agent {
		args := append([]string{}, p.vkArgs...)
		for i, a := range args {
			switch a {
			case "--kubelet-listen":
				args[i+1] = s.Env["BRIDGE_IP"] + ":" + strconv.Itoa(freePort(t))
			case "--metrics-listen":
				args[i+1] = "127.0.0.1:" + strconv.Itoa(freePort(t))
			}
		}
		a := launchAgent(t, p.vkBin, append(args, "--leader-elect", "--leader-elect-namespace", p.ns))
		p.standbys = append(p.standbys, a)
		return a
	}
	holder := func(ctx context.Context) (*coordinationv1.Lease, error) {
		return s.Kube.CoordinationV1().Leases(p.ns).Get(ctx, lease, metav1.GetOptions{})
	}
	// A leads (it is alone when it takes the Lease); B stands by.
	a := replica()
	p.vk = a
	var first string
	framework.Eventually(t, time.Minute, "replica A to take the Lease", func(ctx context.Context) (bool, error) {
		l, err := holder(ctx)
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, nil
		}
		first = *l.Spec.HolderIdentity
		return true, nil
	})
	b := replica()

	// Before the burst: sandboxes whose address and files must survive.
	const before = 5
	for i := range before {
		p.create(p.newPod(fmt.Sprintf("early-%d", i), s.BusyboxImage))
	}
	ips := map[string]string{}
	for i := range before {
		name := fmt.Sprintf("early-%d", i)
		pod := p.waitPod(name, 2*time.Minute, "Ready", podReady)
		ips[name] = pod.Status.PodIP
		if _, err := daemonAt(t, pod.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Shell: "echo " + name + " > /marker"}); err != nil {
			t.Fatal(err)
		}
	}

	// The burst; the leader dies a third of the way in.
	const burst = 200
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Small requests: 205 pods fit the pool's 8 CPUs.
			pod := p.newPod(fmt.Sprintf("burst-%d", i), s.BusyboxImage, func(pod *corev1.Pod) {
				pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}
			})
			if _, err := s.Kube.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	framework.Eventually(t, 3*time.Minute, "a third of the burst Ready", func(ctx context.Context) (bool, error) {
		return p.countReady(ctx) >= before+burst/3, nil
	})
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	killed := time.Now()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("create: %v", err)
	}

	var took time.Duration
	framework.Eventually(t, 30*time.Second, "the standby to take the Lease", func(ctx context.Context) (bool, error) {
		l, err := holder(ctx)
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == first {
			return false, nil
		}
		took = time.Since(killed)
		return true, nil
	})
	p.vk = b
	if took > 15*time.Second {
		t.Errorf("the standby took %v to lead, want at most 15 s", took)
	}
	var execAfter time.Duration
	framework.Eventually(t, 30*time.Second, "kubectl exec through the new leader", func(ctx context.Context) (bool, error) {
		out, _, code := kubectl(t, s, "", "-n", p.ns, "exec", "early-0", "--", "cat", "/marker")
		if code != 0 || out != "early-0\n" {
			return false, nil
		}
		execAfter = time.Since(killed)
		return true, nil
	})
	if execAfter > 20*time.Second {
		t.Errorf("kubectl exec worked again %v after the kill, want at most 20 s", execAfter)
	}
	if !p.waitAllReady(4*time.Minute, before+burst) {
		t.FailNow()
	}
	t.Logf("leader killed with %d pods of %d Ready: standby leading after %v, kubectl exec after %v", before+burst/3, before+burst, took, execAfter)

	// Bound once each: every Running pod has exactly one slot, and no
	// slot holds a pod that is not Running.
	pods, err := s.Kube.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running := map[string]bool{}
	for _, pod := range pods.Items {
		if pod.Status.Phase == corev1.PodRunning {
			running[string(pod.UID)] = true
		}
		if name := pod.Name; strings.HasPrefix(name, "early-") && pod.Status.PodIP != ips[name] {
			t.Errorf("%s moved from %s to %s across the failover", name, ips[name], pod.Status.PodIP)
		}
	}
	seen := map[string]int{}
	for _, ag := range p.agents {
		inv, err := ag.client.Inventory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sl := range inv.Slots {
			if sl.Pod != nil {
				seen[sl.Pod.UID]++
			}
		}
	}
	if len(running) != before+burst || len(seen) != len(running) {
		t.Errorf("%d Running pods, %d pods holding slots, want %d of each", len(running), len(seen), before+burst)
	}
	for uid, n := range seen {
		if n != 1 || !running[uid] {
			t.Errorf("pod %s holds %d slots (Running: %v)", uid, n, running[uid])
		}
	}
	for i := range before {
		name := fmt.Sprintf("early-%d", i)
		r, err := daemonAt(t, ips[name], trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"cat", "/marker"}})
		if err != nil || string(r.Stdout) != name+"\n" {
			t.Errorf("%s's files after the failover: %q %v", name, r.Stdout, err)
		}
	}

	// A graceful stop hands the Lease over at once.
	c := replica()
	second := ""
	if l, err := holder(ctx); err == nil && l.Spec.HolderIdentity != nil {
		second = *l.Spec.HolderIdentity
	}
	b.stop(t)
	stopped := time.Now()
	p.vk = c
	framework.Eventually(t, 15*time.Second, "a replica to lead after a graceful stop", func(ctx context.Context) (bool, error) {
		l, err := holder(ctx)
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && *l.Spec.HolderIdentity != second, nil
	})
	t.Logf("after SIGTERM to the leader, the next replica led in %v", time.Since(stopped))
	if d := time.Since(stopped); d > 5*time.Second {
		t.Errorf("a graceful stop took %v to hand over, want the Lease released at once", d)
	}
}

// countReady counts the pool's Ready pods.
func (p *vpool) countReady(ctx context.Context) int {
	pods, err := p.s.Kube.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0
	}
	n := 0
	for i := range pods.Items {
		if podReady(&pods.Items[i]) {
			n++
		}
	}
	return n
}

// waitAllReady waits for want Ready pods in the pool's namespace and, if
// they do not come, says where the others are.
func (p *vpool) waitAllReady(timeout time.Duration, want int) bool {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p.countReady(p.t.Context()) == want {
			return true
		}
		time.Sleep(500 * time.Millisecond)
	}
	pods, err := p.s.Kube.CoreV1().Pods(p.ns).List(p.t.Context(), metav1.ListOptions{})
	if err != nil {
		p.t.Errorf("list pods: %v", err)
		return false
	}
	states := map[string]int{}
	shown := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		if podReady(pod) {
			continue
		}
		key := fmt.Sprintf("node=%q phase=%s reason=%q", pod.Spec.NodeName, pod.Status.Phase, pod.Status.Reason)
		states[key]++
		if shown < 5 {
			shown++
			p.t.Logf("not Ready: %s %s message=%q conditions=%+v", pod.Name, key, pod.Status.Message, pod.Status.Conditions)
		}
	}
	p.t.Errorf("%d of %d pods Ready after %v; the others: %v", p.countReady(p.t.Context()), want, timeout, states)
	return false
}
