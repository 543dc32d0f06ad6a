//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// TestMove: on a pool whose node agents share a checkpoint repository, a
// drain (its worker cordoned) moves gVisor sandboxes instead of evicting
// them. A running one holding 64 MiB and a listener goes on on the other
// worker — Moving, then Ready, the same process with the same memory at
// its new address; a paused one stays paused, held by no worker, and its
// resume restores it on the other worker; a paused one deleted before its
// resume has its checkpoint deleted from the registry, as the restored
// ones have; a runc sandbox is evicted, saying why it could not move.
func TestMove(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ensureRuntimeClass(t, s, "gvisor", runtime.RuntimeHandlerRunsc)
	repo := s.Registry + "/sandman-e2e-moved-" + rand.String(5)
	p := startPool(t, s, 2, 5, "--checkpoint-repository", repo,
		"--drain-when-cordoned", "--kubeconfig", s.Env["KUBECONFIG"])
	ctx := t.Context()
	from, to := p.agents[0], p.agents[1]
	// The host-process agents are not kubelet nodes: each watches a Node
	// object of its name, as its worker's would be in a cluster.
	for _, a := range p.agents {
		if _, err := s.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.name,
			Labels: map[string]string{"sandman.io/e2e": "move"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Kube.CoreV1().Nodes().Delete(context.Background(), a.name, metav1.DeleteOptions{}) })
	}
	cordon := func(a *vagent, on bool) {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
		if _, err := s.Kube.CoreV1().Nodes().Patch(ctx, a.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	slotsOn := func(a *vagent) map[runtime.SlotState]int {
		inv, err := a.client.Inventory(ctx)
		if err != nil {
			return nil
		}
		return inv.Count()
	}
	// Everything starts on the first worker: the second is cordoned.
	cordon(to, true)
	framework.Eventually(t, time.Minute, "the second worker drained", func(context.Context) (bool, error) {
		c := slotsOn(to)
		return c != nil && len(c) == 0, nil
	})
	gvisor := func(pod *corev1.Pod) {
		pod.Spec.RuntimeClassName = ptr.To("gvisor")
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	}
	for _, n := range []string{"runner", "sleeper", "doomed", "lost"} {
		p.create(p.newPod(n, s.DebianImage, gvisor))
	}
	p.create(p.newPod("plain", s.BusyboxImage))
	ips := map[string]string{}
	for _, n := range []string{"runner", "sleeper", "doomed", "lost", "plain"} {
		ips[n] = p.waitPod(n, 3*time.Minute, "Ready", podReady).Status.PodIP
	}
	ask := func(ip string) (string, error) {
		c, err := net.DialTimeout("tcp", ip+":8080", 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	before := map[string]string{}
	for _, n := range []string{"runner", "sleeper"} {
		if _, err := daemonAt(t, ips[n], trainerToken).StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-c", statefulServer64}}); err != nil {
			t.Fatal(err)
		}
		framework.Eventually(t, 2*time.Minute, n+"'s stateful server", func(context.Context) (bool, error) {
			var err error
			before[n], err = ask(ips[n])
			return err == nil, nil
		})
	}
	for _, n := range []string{"sleeper", "doomed", "lost"} {
		if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "annotate", "pod", n, podcontract.AnnotationPause+"=true"); code != 0 {
			t.Fatalf("kubectl annotate %s: %d %q %q", n, code, out, errOut)
		}
		p.waitPod(n, time.Minute, "paused", func(pod *corev1.Pod) bool { return pod.Status.Reason == podcontract.ReasonPaused })
	}

	// The second worker takes sandboxes again; the first is drained.
	cordon(to, false)
	framework.Eventually(t, time.Minute, "the second worker's warm slots", func(context.Context) (bool, error) {
		return slotsOn(to)[runtime.StateWarm] > 0, nil
	})
	begin := time.Now()
	cordon(from, true)
	moved := p.waitPod("runner", 3*time.Minute, "Ready on the other worker", func(pod *corev1.Pod) bool {
		return podReady(pod) && pod.Status.PodIP != "" && pod.Status.PodIP != ips["runner"]
	})
	t.Logf("cordon → the moved sandbox Ready: %v", time.Since(begin).Round(time.Millisecond))
	after, err := ask(moved.Status.PodIP)
	if err != nil {
		t.Fatalf("the moved server at %s: %v", moved.Status.PodIP, err)
	}
	b, a := strings.Fields(before["runner"]), strings.Fields(after)
	if len(a) != 3 || len(b) != 3 || a[0] != b[0] || a[1] != b[1] || a[2] != "2" {
		t.Fatalf("before the move the server said %q, after %q: want the same digest and pid, connection 2", before["runner"], after)
	}
	bound, err := p.boundSlots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sl, ok := bound[string(moved.UID)]; !ok || sl.IP != moved.Status.PodIP {
		t.Errorf("the moved pod's slot: %+v (found %v), want one at %s", sl, ok, moved.Status.PodIP)
	}
	if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "exec", "runner", "--", "echo", "moved"); code != 0 || out != "moved\n" {
		t.Errorf("kubectl exec in the moved sandbox: %d %q %q", code, out, errOut)
	}
	// The runc sandbox cannot move: evicted, saying why.
	plain := p.waitPod("plain", time.Minute, "evicted", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if plain.Status.Reason != runtime.ReasonEvicted || !strings.Contains(plain.Status.Message, "CRIU") {
		t.Errorf("the runc pod: %s %q, want Evicted saying it could not move (CRIU)", plain.Status.Reason, plain.Status.Message)
	}
	// The paused ones stay paused, on no worker.
	framework.Eventually(t, time.Minute, "the drained worker to hold no slot", func(context.Context) (bool, error) {
		c := slotsOn(from)
		return c != nil && len(c) == 0, nil
	})
	refs := map[string]string{}
	for _, n := range []string{"runner", "sleeper", "doomed", "lost"} {
		pod := p.waitPod(n, time.Minute, "its move recorded", func(pod *corev1.Pod) bool { return true })
		refs[n] = movedRef(t, s, p.ns, n)
		if n == "runner" {
			continue
		}
		if pod.Status.Reason != podcontract.ReasonPaused || podReady(pod) {
			t.Errorf("pod %s after the drain: %s %q ready %v, want Paused", n, pod.Status.Reason, pod.Status.Message, podReady(pod))
		}
		if _, ok := bound[string(pod.UID)]; ok {
			t.Errorf("the paused pod %s holds a slot after its worker was drained", n)
		}
	}

	// A virtual node that restarts now takes the paused ones up from
	// their pods (sandman.io/moved) instead of reporting them lost.
	for _, n := range []string{"sleeper", "doomed"} {
		p.waitPod(n, time.Minute, "its move recorded in the pod", func(pod *corev1.Pod) bool {
			return strings.Contains(pod.Annotations[podcontract.AnnotationMoved], refs[n])
		})
	}
	p.killVK()
	p.startVK()
	for _, n := range []string{"sleeper", "doomed"} {
		p.waitPod(n, time.Minute, "paused off any worker after the virtual node's restart", func(pod *corev1.Pod) bool {
			return pod.Status.Reason == podcontract.ReasonPaused && pod.Status.Phase == corev1.PodRunning
		})
	}

	// A checkpoint gone from the registry: its resume fails the pod,
	// saying so, and leaves nothing behind.
	deleteManifest(t, refs["lost"])
	if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "annotate", "pod", "lost", podcontract.AnnotationPause+"-"); code != 0 {
		t.Fatalf("kubectl annotate: %d %q %q", code, out, errOut)
	}
	lost := p.waitPod("lost", 2*time.Minute, "failed", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if lost.Status.Reason != podcontract.ReasonResumeFailed || !strings.Contains(lost.Status.Message, "gone") {
		t.Errorf("the pod whose checkpoint is gone: %s %q, want ResumeFailed saying it is gone", lost.Status.Reason, lost.Status.Message)
	}
	delete(refs, "lost")

	// Resumed, the paused one runs on the other worker from where it
	// stopped.
	if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "annotate", "pod", "sleeper", podcontract.AnnotationPause+"-"); code != 0 {
		t.Fatalf("kubectl annotate: %d %q %q", code, out, errOut)
	}
	resumed := p.waitPod("sleeper", 2*time.Minute, "resumed and Ready", func(pod *corev1.Pod) bool {
		for _, c := range pod.Status.Conditions {
			if c.Type == podcontract.ConditionPaused {
				return c.Reason == podcontract.ReasonResumed && podReady(pod)
			}
		}
		return false
	})
	if _, ok := resumed.Annotations[podcontract.AnnotationMoved]; ok {
		p.waitPod("sleeper", time.Minute, "sandman.io/moved removed once restored", func(pod *corev1.Pod) bool {
			_, ok := pod.Annotations[podcontract.AnnotationMoved]
			return !ok
		})
	}
	after, err = ask(resumed.Status.PodIP)
	if err != nil {
		t.Fatalf("the resumed server at %s: %v", resumed.Status.PodIP, err)
	}
	b, a = strings.Fields(before["sleeper"]), strings.Fields(after)
	if len(a) != 3 || len(b) != 3 || a[0] != b[0] || a[1] != b[1] || a[2] != "2" {
		t.Fatalf("before the pause the server said %q, after the move and resume %q: want the same digest and pid, connection 2", before["sleeper"], after)
	}

	// Paused again, on a worker then filled: its resume finds no room
	// there, so it moves off and is restored where the pool finds room
	// (the first worker, taking sandboxes again).
	pauseAndWait := func(n string) {
		t.Helper()
		if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "annotate", "pod", n, podcontract.AnnotationPause+"=true"); code != 0 {
			t.Fatalf("kubectl annotate %s: %d %q %q", n, code, out, errOut)
		}
		p.waitPod(n, time.Minute, "paused", func(pod *corev1.Pod) bool { return pod.Status.Reason == podcontract.ReasonPaused })
	}
	pauseAndWait("sleeper")
	p.create(p.newPod("big", s.BusyboxImage, func(pod *corev1.Pod) {
		pod.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("3850m")
	}))
	p.waitPod("big", time.Minute, "Ready", podReady)
	cordon(from, false)
	framework.Eventually(t, time.Minute, "the first worker's warm slots", func(context.Context) (bool, error) {
		return slotsOn(from)[runtime.StateWarm] > 0, nil
	})
	if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "annotate", "pod", "sleeper", podcontract.AnnotationPause+"-"); code != 0 {
		t.Fatalf("kubectl annotate: %d %q %q", code, out, errOut)
	}
	resumed = p.waitPod("sleeper", 2*time.Minute, "resumed on the worker with room", func(pod *corev1.Pod) bool {
		c, ok := pausedCondition(pod)
		return ok && c.Reason == podcontract.ReasonResumed && podReady(pod)
	})
	after, err = ask(resumed.Status.PodIP)
	if err != nil {
		t.Fatalf("the server resumed elsewhere at %s: %v", resumed.Status.PodIP, err)
	}
	if a = strings.Fields(after); len(a) != 3 || a[0] != b[0] || a[1] != b[1] || a[2] != "3" {
		t.Fatalf("before the pause the server said %q, resumed on another worker %q: want the same digest and pid, connection 3", before["sleeper"], after)
	}
	if inv, err := from.client.Inventory(ctx); err != nil || !holds(inv, string(resumed.UID)) {
		t.Errorf("the sandbox resumed for want of room is not on the worker with room (%v)", err)
	}
	refs["sleeper-again"] = movedRefAfter(t, s, p.ns, "sleeper", refs["sleeper"])

	// Deleted while paused off any worker: its checkpoint goes too.
	if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "delete", "pod", "doomed", "--wait=false"); code != 0 {
		t.Fatalf("kubectl delete: %d %q %q", code, out, errOut)
	}
	for n, ref := range refs {
		framework.Eventually(t, time.Minute, n+"'s checkpoint deleted from the registry", func(ctx context.Context) (bool, error) {
			return !manifestExists(ctx, ref), nil
		})
	}
}

// holds reports whether an inventory has a slot of pod uid.
func holds(inv runtime.Inventory, uid string) bool {
	for _, sl := range inv.Slots {
		if sl.Pod != nil && sl.Pod.UID == uid {
			return true
		}
	}
	return false
}

// pausedCondition is the pod's sandman.io/Paused condition.
func pausedCondition(pod *corev1.Pod) (corev1.PodCondition, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == podcontract.ConditionPaused {
			return c, true
		}
	}
	return corev1.PodCondition{}, false
}

var movedRefRE = regexp.MustCompile(`waits in (\S+@sha256:[0-9a-f]{64})`)

// movedRef is the checkpoint a pod's Moving or Moved event names.
func movedRef(t *testing.T, s *framework.Stack, ns, name string) string {
	t.Helper()
	return movedRefAfter(t, s, ns, name, "")
}

// movedRefAfter is a checkpoint a pod's move event names other than not.
func movedRefAfter(t *testing.T, s *framework.Stack, ns, name, not string) string {
	t.Helper()
	var ref string
	framework.Eventually(t, time.Minute, "pod "+name+"'s move event", func(ctx context.Context) (bool, error) {
		evs, err := s.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if m := movedRefRE.FindStringSubmatch(e.Message); m != nil && m[1] != not && (e.Reason == podcontract.ReasonMoving || e.Reason == podcontract.ReasonMoved) {
				ref = m[1]
				return true, nil
			}
		}
		return false, nil
	})
	return ref
}

// deleteManifest deletes a manifest by digest from the (plain HTTP)
// registry.
func deleteManifest(t *testing.T, ref string) {
	t.Helper()
	name, dgst, _ := strings.Cut(ref, "@")
	host, path, _ := strings.Cut(name, "/")
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, "http://"+host+"/v2/"+path+"/manifests/"+dgst, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("delete %s: %s", ref, resp.Status)
	}
}

// manifestExists asks the (plain HTTP) registry for a manifest by digest.
func manifestExists(ctx context.Context, ref string) bool {
	name, dgst, _ := strings.Cut(ref, "@")
	host, path, _ := strings.Cut(name, "/")
	req, _ := http.NewRequestWithContext(ctx, http.MethodHead, "http://"+host+"/v2/"+path+"/manifests/"+dgst, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return true
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusNotFound
}
