//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
)

// The trainer's token in these tests, and the hash its pods carry.
const trainerToken = "trainer-token-e2e"

func trainerHash() string {
	sum := sha256.Sum256([]byte(trainerToken))
	return hex.EncodeToString(sum[:])
}

// vpool is a virtual node (sandman-vk) over real node agents on the stack.
type vpool struct {
	t      *testing.T
	s      *framework.Stack
	name   string // pool
	node   string // virtual node
	ns     string
	agents []*vagent
	vkBin  string
	vkArgs []string
	vk     *agent
	// standbys are more sandman-vk replicas (TestVKFailover): stopped with
	// vk, after the pods are gone.
	standbys []*agent
	// metrics is sandman-vk's /metrics and capacity page address.
	metrics string
}

type vagent struct {
	name, addr, namespace string
	bin                   string
	args                  []string
	proc                  *agent
	client                *nodeapi.Client
}

// restart starts the agent's process again after a test killed or
// stopped it. The pool's cleanup stops it, after the pods are gone: a
// cleanup of its own would run first and stop it while it still holds
// the sandboxes of live pods, which no one would release then.
func (a *vagent) restart(t *testing.T) {
	t.Helper()
	a.proc = launchAgent(t, a.bin, a.args)
}

// expectAgentsLeftNothing fails the test if the stopped agents left
// anything in their containerd namespaces or state dirs (the pods were
// gone first, so a clean stop removes every slot), naming it with their
// output. The tier's census would find it too, but not say whose it is.
func (p *vpool) expectAgentsLeftNothing() {
	t := p.t
	var left []string
	// The shims of the last containers end just after them.
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		// Each census gets its own time: one cut off by the poll's
		// deadline would hide what was left.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := framework.TakeCensus(ctx, p.s.ContainerdAddress)
		if err != nil {
			left = []string{"census: " + err.Error()}
			return false, nil
		}
		left = left[:0]
		for _, a := range p.agents {
			left = append(left, c.Holding(a.namespace, argValue(a.args, "--state-dir"))...)
		}
		return len(left) == 0, nil
	})
	if err == nil {
		return
	}
	t.Errorf("the stopped agents left %d things behind:\n  %s", len(left), strings.Join(left, "\n  "))
	for _, a := range p.agents {
		t.Logf("agent %s output:\n%s", a.name, a.proc.out.String())
	}
}

// argValue is the value given for flag in args, or "".
func argValue(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}

// startPool starts n node agents with slots each and a virtual node over
// them, in a namespace of its own. agentArgs are more flags for every agent.
func startPool(t *testing.T, s *framework.Stack, n, slots int, agentArgs ...string) *vpool {
	t.Helper()
	return startPoolWith(t, s, poolOptions{agents: n, slots: slots, agentArgs: agentArgs})
}

// poolOptions say what startPoolWith starts.
type poolOptions struct {
	agents, slots int
	// agentArgs are more flags for every node agent.
	agentArgs []string
	// vkArgs, when set, gives more flags for sandman-vk, knowing the pool's
	// names (its namespace, say).
	vkArgs func(p *vpool) []string
}

// startPoolWith is startPool with more to say (sandman-vk's flags).
func startPoolWith(t *testing.T, s *framework.Stack, o poolOptions) *vpool {
	t.Helper()
	n, slots, agentArgs := o.agents, o.slots, o.agentArgs
	id := rand.String(5)
	p := &vpool{t: t, s: s, name: "e2e-" + id, node: "sandman-e2e-" + id, ns: "vk-" + id}
	nodeBin := buildNode(t, s.Root)
	daemonBin := buildDaemon(t, s.Root)
	p.vkBin = buildBinary(t, s.Root, "sandman-vk")
	var agents []string
	// Registered first, so it runs last: after the pods are gone and
	// sandman-vk has stopped (see below). Whatever process each agent has
	// then, restarted ones included, is stopped.
	t.Cleanup(func() {
		for _, a := range p.agents {
			a.proc.stop(t)
		}
		p.expectAgentsLeftNothing()
	})
	for i := range n {
		name := fmt.Sprintf("w%d-%s", i, id)
		a := &vagent{name: name, addr: "127.0.0.1:" + strconv.Itoa(freePort(t)), namespace: "sandman-e2e-" + name, bin: nodeBin}
		a.args = []string{"--node", name, "--containerd-address", s.ContainerdAddress, "--namespace", a.namespace,
			"--slots", strconv.Itoa(slots), "--warm-slots", "2", "--cpu", "4", "--memory", "8Gi",
			"--state-dir", filepath.Join(framework.StateDir(), "e2e-nodes", name), "--daemon-path", daemonBin, "--runc", s.RuncBin, "--runsc", s.RunscBin,
			"--cni-conf-dir", s.CNIConfDir, "--cni-bin-dir", s.CNIBinDir, "--listen", a.addr}
		a.args = append(a.args, agentArgs...)
		a.proc = launchAgent(t, nodeBin, a.args)
		a.client = nodeapi.NewClient(a.addr, "pool-secret", nil)
		p.agents = append(p.agents, a)
		agents = append(agents, name+"="+a.addr)
	}
	for _, a := range p.agents {
		framework.Eventually(t, time.Minute, "node agent "+a.name+" to have warm slots", func(ctx context.Context) (bool, error) {
			inv, err := a.client.Inventory(ctx)
			return err == nil && inv.Count()[runtime.StateWarm] > 0, nil
		})
	}
	p.metrics = "127.0.0.1:" + strconv.Itoa(freePort(t))
	// The control key is sandman-vk's alone: the agents hold the pool
	// token (SANDMAN_POOL_TOKEN), which no longer derives sandbox tokens.
	controlKeys := filepath.Join(t.TempDir(), "control-keys")
	if err := os.WriteFile(controlKeys, []byte(rand.String(32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.vkArgs = []string{"--kubeconfig", s.Env["KUBECONFIG"], "--pool", p.name, "--node-name", p.node,
		"--node-ip", s.Env["BRIDGE_IP"], "--kubelet-listen", s.Env["BRIDGE_IP"] + ":" + strconv.Itoa(freePort(t)),
		"--tls-cert-file", filepath.Join(s.Env["PKI"], "kubelet-serving.crt"), "--tls-key-file", filepath.Join(s.Env["PKI"], "kubelet-serving.key"),
		"--client-ca-file", filepath.Join(s.Env["PKI"], "ca.crt"),
		"--node-agents", strings.Join(agents, ","), "--metrics-listen", p.metrics, "--pool-secret-file", controlKeys,
		"--reconcile-interval", "1s", "--orphan-grace", "3s", "--lost-after", "5s"}
	if o.vkArgs != nil {
		p.vkArgs = append(p.vkArgs, o.vkArgs(p)...)
	}
	ctx := t.Context()
	if _, err := s.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.NamespaceReady(t, p.ns)
	// Cleanups run last-registered first: the pods go while the virtual
	// node still serves them (freeing their slots), then sandman-vk stops,
	// then the node object and the namespace go. Deleting the node first
	// would leave the pods to the pod garbage collector, which takes ~40 s.
	t.Cleanup(func() {
		ctx := context.Background()
		_ = s.Kube.CoreV1().Nodes().Delete(ctx, p.node, metav1.DeleteOptions{})
		_ = s.Kube.CoreV1().Namespaces().Delete(ctx, p.ns, metav1.DeleteOptions{})
	})
	t.Cleanup(func() {
		if p.vk != nil {
			p.vk.stop(t)
		}
		for _, a := range p.standbys {
			a.stop(t)
		}
	})
	p.startVK()
	t.Cleanup(func() {
		ctx := context.Background()
		_ = s.Kube.CoreV1().Pods(p.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		var left []string
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			l, err := s.Kube.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			left = left[:0]
			for _, pod := range l.Items {
				left = append(left, fmt.Sprintf("%s (%s, deleting since %v)", pod.Name, pod.Status.Phase, pod.DeletionTimestamp))
			}
			return len(left) == 0, nil
		})
		if err != nil {
			t.Errorf("waiting 1m for the test's pods to be gone: %v; left: %v", err, left)
			return
		}
		// A pod's object can be gone before its slot is: one deleted while
		// its bind was in flight (it waited in the pool's queue, say) is
		// released once the bind ends, or by the reconciler's orphan
		// sweep; one deleted at once (grace 0) is gone from the API as its
		// release starts. sandman-vk must see that through before it
		// stops, and the agents must have finished the releases: an agent
		// stopped with a hundred under way spends its stop budget on them
		// and leaves its warm slots behind.
		var held []string
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			held = held[:0]
			for _, a := range p.agents {
				inv, err := a.client.Inventory(ctx)
				if err != nil {
					continue // a dead agent releases nothing; the census reports what it holds
				}
				for _, sl := range inv.Slots {
					if sl.Pod != nil { // binding, bound or releasing
						held = append(held, fmt.Sprintf("%s on %s (%s)", sl.Pod.Name, a.name, sl.State))
					}
				}
			}
			return len(held) == 0, nil
		})
		if err != nil {
			t.Errorf("waiting 1m for every slot of the test's pods to be released: %v; still held: %v", err, held)
		}
	})
	framework.Eventually(t, time.Minute, "virtual node "+p.node+" Ready", func(ctx context.Context) (bool, error) {
		n, err := s.Kube.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	return p
}

// startVK starts sandman-vk; the pool's cleanup stops the one running.
func (p *vpool) startVK() {
	p.vk = launchAgent(p.t, p.vkBin, p.vkArgs)
}

// killVK kills sandman-vk with SIGKILL.
func (p *vpool) killVK() {
	_ = p.vk.cmd.Process.Signal(syscall.SIGKILL)
	<-p.vk.done
}

// newPod is a sandbox pod for the pool: node selector, toleration, token.
func (p *vpool) newPod(name, image string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.ns,
			Annotations: map[string]string{"sandman.io/token-sha256": trainerHash()},
			Labels:      map[string]string{"sandman.io/job": "e2e"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"sandman.io/pool": p.name},
			Tolerations:  []corev1.Toleration{{Key: "sandman.io/pool", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{Name: "task", Image: image, Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			}}},
		},
	}
	for _, m := range mutate {
		m(pod)
	}
	return pod
}

func (p *vpool) create(pod *corev1.Pod) {
	p.t.Helper()
	if _, err := p.s.Kube.CoreV1().Pods(p.ns).Create(p.t.Context(), pod, metav1.CreateOptions{}); err != nil {
		p.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
}

// waitPod polls a pod of the pool's namespace until cond holds.
func (p *vpool) waitPod(name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	p.t.Helper()
	return p.waitPodIn(p.ns, name, timeout, what, cond)
}

// waitPodIn polls a pod of namespace ns until cond holds.
func (p *vpool) waitPodIn(ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	p.t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(p.t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pod, err := p.s.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = pod
		return cond(pod), nil
	})
	if err != nil {
		// Say where the pod is: its status and what the agents hold for it.
		var where []string
		if last != nil {
			where = append(where, fmt.Sprintf("status: node %q phase %s reason %q message %q conditions %+v", last.Spec.NodeName, last.Status.Phase, last.Status.Reason, last.Status.Message, last.Status.Conditions))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, a := range p.agents {
				inv, err := a.client.Inventory(ctx)
				if err != nil {
					where = append(where, fmt.Sprintf("agent %s: %v", a.name, err))
					continue
				}
				for _, sl := range inv.Slots {
					if sl.Pod != nil && sl.Pod.UID == string(last.UID) {
						where = append(where, fmt.Sprintf("agent %s: slot %s %s ready=%v since %v", a.name, sl.ID, sl.State, sl.Ready, sl.Since))
					}
				}
				where = append(where, fmt.Sprintf("agent %s: %v", a.name, inv.Count()))
			}
		}
		p.t.Fatalf("waiting %v for pod %s %s: %v\n%s", timeout, name, what, err, strings.Join(where, "\n"))
	}
	return last
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// boundSlots counts the slots holding pods on every agent.
func (p *vpool) boundSlots(ctx context.Context) (map[string]runtime.Slot, error) {
	out := map[string]runtime.Slot{}
	for _, a := range p.agents {
		inv, err := a.client.Inventory(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range inv.Slots {
			if s.Pod != nil && (s.State == runtime.StateBound || s.State == runtime.StateBinding || s.State == runtime.StatePaused) {
				if _, dup := out[s.Pod.UID]; dup {
					return nil, fmt.Errorf("pod %s bound twice", s.Pod.UID)
				}
				out[s.Pod.UID] = s
			}
		}
	}
	return out, nil
}

func daemonAt(t *testing.T, ip, token string) *client.Client {
	t.Helper()
	c, err := client.New(ip+":49983", client.WithToken(token), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestVKPodsBecomeSandboxes: pods with the pool's node selector are bound by
// kube-scheduler and become Ready sandboxes; so do pods that set
// spec.nodeName; the daemon answers at the pod IP with the pod's token and
// no other; deleting the pods frees their slots and leaves no containers.
func TestVKPodsBecomeSandboxes(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 2, 4)
	ctx := t.Context()

	n, err := s.Kube.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// 2 agents × 4 slots, plus the queue room the node advertises (and
	// says it does).
	room, _ := strconv.Atoi(n.Annotations[podcontract.AnnotationQueueRoom])
	if got := n.Status.Capacity.Pods().Value(); got != int64(8+room) {
		t.Fatalf("node capacity: %d pods, want 8 slots (2 agents × 4) + %d queue room", got, room)
	}
	if room > 0 && !strings.HasPrefix(n.Annotations[podcontract.AnnotationSlots], "8 slots, ") {
		t.Fatalf("annotation %s = %q, want the 8 slots", podcontract.AnnotationSlots, n.Annotations[podcontract.AnnotationSlots])
	}
	if n.Labels["sandman.io/pool"] != p.name || n.Labels["type"] != "virtual-kubelet" || len(n.Spec.Taints) == 0 {
		t.Fatalf("node labels %v taints %v", n.Labels, n.Spec.Taints)
	}

	p.create(p.newPod("scheduled", s.BusyboxImage))
	p.create(p.newPod("direct", s.BusyboxImage, func(pod *corev1.Pod) {
		pod.Spec.NodeName = p.node
		pod.Spec.NodeSelector = nil
	}))
	for _, name := range []string{"scheduled", "direct"} {
		pod := p.waitPod(name, 2*time.Minute, "Ready", podReady)
		if pod.Spec.NodeName != p.node || pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning {
			t.Fatalf("pod %s: node %q ip %q phase %s", name, pod.Spec.NodeName, pod.Status.PodIP, pod.Status.Phase)
		}
		cs := pod.Status.ContainerStatuses
		if len(cs) != 1 || !cs[0].Ready || cs[0].State.Running == nil || !strings.HasPrefix(cs[0].ContainerID, "containerd://") {
			t.Fatalf("pod %s container status %+v", name, cs)
		}
		res, err := daemonAt(t, pod.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"hostname"}})
		if err != nil || string(res.Stdout) != name+"\n" {
			t.Fatalf("exec in %s: %v %+v", name, err, res)
		}
		if _, err := daemonAt(t, pod.Status.PodIP, "not-the-token").Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); !client.IsCode(err, api.CodeUnauthorized) {
			t.Fatalf("exec with a wrong token: %v, want unauthorized", err)
		}
	}
	bound, err := p.boundSlots(ctx)
	if err != nil || len(bound) != 2 {
		t.Fatalf("bound slots %v %v, want 2", bound, err)
	}

	for _, name := range []string{"scheduled", "direct"} {
		if err := s.Kube.CoreV1().Pods(p.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, time.Minute, "pods gone and slots free", func(ctx context.Context) (bool, error) {
		l, err := s.Kube.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 0 {
			return false, nil
		}
		b, err := p.boundSlots(ctx)
		return err == nil && len(b) == 0, nil
	})
	p.expectNoContainersBut(0)
}

// expectNoContainersBut checks that the agents' containerd namespaces hold
// only the containers of bound pods (n in all) — warm slots have none, and
// shim groups' holders are no pod's.
func (p *vpool) expectNoContainersBut(n int) {
	p.t.Helper()
	framework.Eventually(p.t, time.Minute, fmt.Sprintf("%d sandbox containers left", n), func(ctx context.Context) (bool, error) {
		total := 0
		for _, a := range p.agents {
			cc := p.s.Containerd(p.t, a.namespace)
			cs, err := cc.Containers(ctx, fmt.Sprintf(`labels."%s"==%s`, noderuntime.LabelNode, a.name))
			if err != nil {
				return false, err
			}
			for _, c := range cs {
				l, _ := c.Labels(ctx)
				if l[noderuntime.LabelHot] == "" && l[noderuntime.LabelHolder] == "" {
					total++
				}
			}
		}
		return total == n, nil
	})
}

// TestVKBadInput: each bad pod ends with a status that says why, and no
// slot leaks.
func TestVKBadInput(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 4)
	ctx := t.Context()

	p.create(p.newPod("missing-image", s.Registry+"/sandman/nope:missing"))
	p.create(p.newPod("tiny-memory", s.BusyboxImage, func(pod *corev1.Pod) {
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Mi")}
		pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Mi")}
	}))
	p.create(p.newPod("no-token", s.BusyboxImage, func(pod *corev1.Pod) { pod.Annotations = nil }))
	p.create(p.newPod("no-such-pool", s.BusyboxImage, func(pod *corev1.Pod) {
		pod.Spec.NodeSelector = map[string]string{"sandman.io/pool": "does-not-exist"}
	}))

	waiting := func(pod *corev1.Pod) *corev1.ContainerStateWaiting {
		if len(pod.Status.ContainerStatuses) == 0 {
			return nil
		}
		return pod.Status.ContainerStatuses[0].State.Waiting
	}
	pod := p.waitPod("missing-image", 30*time.Second, "to report the image pull error", func(pod *corev1.Pod) bool {
		w := waiting(pod)
		return w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff")
	})
	if w := waiting(pod); !strings.Contains(w.Message, "not found") || pod.Status.Phase != corev1.PodPending {
		t.Fatalf("missing image: phase %s, waiting %+v", pod.Status.Phase, w)
	}
	pod = p.waitPod("tiny-memory", 30*time.Second, "Failed", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if pod.Status.Reason != runtime.ReasonInvalidSpec || !strings.Contains(pod.Status.Message, "4 MiB") {
		t.Fatalf("tiny memory: reason %q message %q", pod.Status.Reason, pod.Status.Message)
	}
	pod = p.waitPod("no-token", 30*time.Second, "Failed", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if !strings.Contains(pod.Status.Message, "sandman.io/token-sha256") {
		t.Fatalf("no token: reason %q message %q", pod.Status.Reason, pod.Status.Message)
	}
	pod = p.waitPod("no-such-pool", 30*time.Second, "Unschedulable", func(pod *corev1.Pod) bool {
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})
	t.Logf("a pod for a pool that does not exist: %s", pod.Status.Conditions[0].Message)

	// None of them holds a slot.
	b, err := p.boundSlots(ctx)
	if err != nil || len(b) != 0 {
		t.Fatalf("bound slots %v %v, want none", b, err)
	}
	// The image pull is retried with back-off, not forever in a tight loop,
	// and deleting the pod ends it.
	if err := s.Kube.CoreV1().Pods(p.ns).Delete(ctx, "missing-image", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the failing pod to be gone", func(ctx context.Context) (bool, error) {
		_, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, "missing-image", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// TestVKRestartAndLostAgent: kill -9 of sandman-vk with running sandboxes
// and pods created while it is down; after a restart the running ones keep
// their slots (nothing placed twice), the new ones are placed. Then a node
// agent dies mid-burst: the burst lands on the agent that lives, and when
// the dead one comes back the sandboxes it still holds are released.
func TestVKRestartAndLostAgent(t *testing.T) {
	s := framework.Get(t)
	// 12 slots each: the agent that lives takes the whole burst however
	// the seven pods before it were spread (with 8, a 2/5 split left one
	// burst pod waiting for room).
	p := startPool(t, s, 2, 12)
	ctx := t.Context()

	names := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%d", prefix, i))
		}
		return out
	}
	first := names("before", 4)
	for _, n := range first {
		p.create(p.newPod(n, s.BusyboxImage))
	}
	ips := map[string]string{}
	for _, n := range first {
		pod := p.waitPod(n, 2*time.Minute, "Ready", podReady)
		ips[n] = pod.Status.PodIP + " " + pod.Status.ContainerStatuses[0].ContainerID
	}

	p.killVK()
	second := names("while-down", 3)
	for _, n := range second {
		p.create(p.newPod(n, s.BusyboxImage))
	}
	p.startVK()
	for _, n := range append(append([]string{}, first...), second...) {
		p.waitPod(n, 2*time.Minute, "Ready after the restart", podReady)
	}
	for _, n := range first {
		pod, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := pod.Status.PodIP + " " + pod.Status.ContainerStatuses[0].ContainerID; got != ips[n] {
			t.Errorf("pod %s moved: %s → %s", n, ips[n], got)
		}
		if _, err := daemonAt(t, pod.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			t.Errorf("pod %s does not answer after the restart: %v", n, err)
		}
	}
	bound, err := p.boundSlots(ctx)
	if err != nil || len(bound) != len(first)+len(second) {
		t.Fatalf("bound slots: %d (%v), want %d", len(bound), err, len(first)+len(second))
	}

	// An agent dies while a burst is placed. The pods it held fail as lost.
	dead := p.agents[0]
	inv, err := dead.client.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	onDead := map[string]bool{}
	for _, sl := range inv.Slots {
		if sl.Pod != nil {
			onDead[sl.Pod.Name] = true
		}
	}
	burst := names("burst", 4)
	for _, n := range burst {
		p.create(p.newPod(n, s.BusyboxImage))
	}
	_ = dead.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-dead.proc.done
	for _, n := range burst {
		pod := p.waitPod(n, 2*time.Minute, "Ready or reported lost", func(pod *corev1.Pod) bool {
			return podReady(pod) || pod.Status.Phase == corev1.PodFailed
		})
		t.Logf("pod %s: %s %s %s", n, pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
		if pod.Status.Phase == corev1.PodFailed && (pod.Status.Reason != "NodeLost" || !strings.Contains(pod.Status.Message, dead.name)) {
			t.Errorf("pod %s failed with %q %q, want NodeLost naming %s", n, pod.Status.Reason, pod.Status.Message, dead.name)
		}
	}
	for n := range onDead {
		pod := p.waitPod(n, time.Minute, "failed as lost", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
		if pod.Status.Reason != "NodeLost" {
			t.Errorf("pod %s on the dead agent: %s %q", n, pod.Status.Reason, pod.Status.Message)
		}
	}
	// The dead agent comes back holding sandboxes; those whose pods the
	// virtual node placed elsewhere or gave up on are released.
	dead.restart(t)
	p.waitOnlyLiveBound()
}

// waitOnlyLiveBound waits until every bound slot belongs to a running pod:
// what an agent that came back holds for pods reported lost meanwhile is
// released (the reconciler's orphan grace).
func (p *vpool) waitOnlyLiveBound() {
	p.t.Helper()
	framework.Eventually(p.t, 2*time.Minute, "every bound slot to belong to a live pod", func(ctx context.Context) (bool, error) {
		pods, err := p.s.Kube.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		want := map[string]bool{}
		for _, pod := range pods.Items {
			if pod.Status.Phase == corev1.PodRunning {
				want[string(pod.UID)] = true
			}
		}
		b, err := p.boundSlots(ctx)
		if err != nil {
			return false, nil
		}
		for uid := range b {
			if !want[uid] {
				return false, nil
			}
		}
		return len(b) == len(want), nil
	})
}

// runCommand runs a command and returns stdout, stderr and the exit code;
// a command that cannot run at all fails the test.
func runCommand(t *testing.T, timeout time.Duration, env []string, stdin string, name string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", filepath.Base(name), args, err)
	}
	return out.String(), errb.String(), code
}

// kubectl runs the stack's kubectl.
func kubectl(t *testing.T, s *framework.Stack, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return runCommand(t, time.Minute, []string{"KUBECONFIG=" + s.Env["KUBECONFIG"]}, stdin, s.Env["KUBECTL"], args...)
}

// TestVKKubectl: kubectl exec (with stdin and exit codes), logs (--tail,
// --timestamps, -f), describe and the stats endpoint work against sandbox
// pods through the virtual node's kubelet API; a 5 s deadline fails a pod
// with DeadlineExceeded and frees its slot.
func TestVKKubectl(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 4)
	ctx := t.Context()
	p.create(p.newPod("talker", s.BusyboxImage, func(pod *corev1.Pod) {
		pod.Spec.Containers[0].Command = []string{"sh", "-c", "echo line 1; echo line 2; echo line 3; i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"}
	}))
	pod := p.waitPod("talker", 2*time.Minute, "Ready", podReady)
	ns := []string{"-n", p.ns}

	// exec: output, stderr, exit code, stdin.
	out, errOut, code := kubectl(t, s, "", append(ns, "exec", "talker", "--", "sh", "-c", "echo out; echo err >&2; exit 3")...)
	if out != "out\n" || !strings.Contains(errOut, "err") || code != 3 {
		t.Fatalf("kubectl exec: stdout %q stderr %q exit %d", out, errOut, code)
	}
	if out, errOut, code := kubectl(t, s, "hello stdin", append(ns, "exec", "-i", "talker", "--", "cat")...); out != "hello stdin" || code != 0 {
		t.Fatalf("kubectl exec -i: %q %q %d", out, errOut, code)
	}
	if out, _, _ := kubectl(t, s, "", append(ns, "exec", "talker", "-c", "task", "--", "hostname")...); out != "talker\n" {
		t.Fatalf("kubectl exec -c task hostname: %q", out)
	}

	// logs: the main process's output.
	out, errOut, code = kubectl(t, s, "", append(ns, "logs", "talker")...)
	if code != 0 || !strings.HasPrefix(out, "line 1\nline 2\nline 3\n") {
		t.Fatalf("kubectl logs: %q %q %d", out, errOut, code)
	}
	if out, _, _ := kubectl(t, s, "", append(ns, "logs", "talker", "--tail", "1")...); strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "tick ") {
		t.Fatalf("kubectl logs --tail 1: %q", out)
	}
	out, _, _ = kubectl(t, s, "", append(ns, "logs", "talker", "--timestamps")...)
	first, _, _ := strings.Cut(out, "\n")
	ts, rest, _ := strings.Cut(first, " ")
	if _, err := time.Parse(time.RFC3339Nano, ts); err != nil || rest != "line 1" {
		t.Fatalf("kubectl logs --timestamps: first line %q (%v)", first, err)
	}
	// logs -f: new lines keep arriving.
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	follow := exec.CommandContext(fctx, s.Env["KUBECTL"], append(ns, "logs", "-f", "--tail", "1", "talker")...)
	follow.Env = append(os.Environ(), "KUBECONFIG="+s.Env["KUBECONFIG"])
	pipe, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(pipe)
	var ticks []string
	for len(ticks) < 4 && sc.Scan() {
		ticks = append(ticks, sc.Text())
	}
	cancel()
	_ = follow.Wait()
	if len(ticks) < 4 || ticks[0] == ticks[3] {
		t.Fatalf("kubectl logs -f: %v", ticks)
	}

	// describe and stats.
	if out, _, code := kubectl(t, s, "", append(ns, "describe", "pod", "talker")...); code != 0 || !strings.Contains(out, p.node) || !strings.Contains(out, pod.Status.PodIP) {
		t.Fatalf("kubectl describe: %d %q", code, out)
	}
	raw, err := s.Kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", p.node, "proxy", "stats", "summary").DoRaw(ctx)
	if err != nil {
		t.Fatalf("stats/summary: %v", err)
	}
	var summary struct {
		Pods []struct {
			PodRef struct{ Name string } `json:"podRef"`
			Memory *struct {
				WorkingSetBytes uint64 `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(raw, &summary); err != nil || len(summary.Pods) != 1 || summary.Pods[0].PodRef.Name != "talker" || summary.Pods[0].Memory == nil || summary.Pods[0].Memory.WorkingSetBytes == 0 {
		t.Fatalf("stats/summary: %v %s", err, raw)
	}
	if raw, err := s.Kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", p.node, "proxy", "metrics", "resource").DoRaw(ctx); err != nil || !strings.Contains(string(raw), `pod_memory_working_set_bytes{namespace="`+p.ns+`",pod="talker"}`) {
		t.Fatalf("metrics/resource: %v %s", err, raw)
	}

	// A deadline of 5 s.
	p.create(p.newPod("deadline", s.BusyboxImage, func(pod *corev1.Pod) {
		ads := int64(5)
		pod.Spec.ActiveDeadlineSeconds = &ads
	}))
	p.waitPod("deadline", time.Minute, "Ready", podReady)
	dl := p.waitPod("deadline", 30*time.Second, "Failed", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if dl.Status.Reason != "DeadlineExceeded" {
		t.Fatalf("deadline pod: %s %q %q", dl.Status.Phase, dl.Status.Reason, dl.Status.Message)
	}
	framework.Eventually(t, 30*time.Second, "the expired sandbox's slot to be free", func(ctx context.Context) (bool, error) {
		b, err := p.boundSlots(ctx)
		return err == nil && len(b) == 1, nil
	})
}

// TestVKIdleLeasesAndOwners: an idle timeout reclaims an unused sandbox but
// not one that keeps renewing or runs a long command; deleting an owner pod
// removes its sandboxes through Kubernetes garbage collection.
func TestVKIdleLeasesAndOwners(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 8)
	ctx := t.Context()
	idle := func(pod *corev1.Pod) { pod.Annotations["sandman.io/idle-timeout"] = "3s" }
	for _, n := range []string{"unused", "renewing", "busy"} {
		p.create(p.newPod(n, s.BusyboxImage, idle))
	}
	ips := map[string]string{}
	for _, n := range []string{"unused", "renewing", "busy"} {
		ips[n] = p.waitPod(n, 2*time.Minute, "Ready", podReady).Status.PodIP
	}
	// busy runs one long command; renewing renews every second.
	busyDone := make(chan error, 1)
	go func() {
		_, err := daemonAt(t, ips["busy"], trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"sleep", "8"}})
		busyDone <- err
	}()
	stopRenew := make(chan struct{})
	renewDone := make(chan struct{})
	go func() {
		defer close(renewDone)
		c := daemonAt(t, ips["renewing"], trainerToken)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopRenew:
				return
			case <-tick.C:
				_ = c.Renew(ctx)
			}
		}
	}()
	gone := func(name string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			_, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}
	}
	framework.Eventually(t, 30*time.Second, "the unused sandbox to be reclaimed", gone("unused"))
	for _, n := range []string{"renewing", "busy"} {
		if _, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, n, metav1.GetOptions{}); err != nil {
			t.Fatalf("%s was reclaimed though it was in use: %v", n, err)
		}
	}
	evs, err := s.Kube.CoreV1().Events(p.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=unused,reason=IdleTimeout"})
	if err != nil || len(evs.Items) == 0 {
		t.Fatalf("no IdleTimeout event for the reclaimed pod (%v)", err)
	}
	t.Logf("event: %s", evs.Items[0].Message)
	if err := <-busyDone; err != nil {
		t.Fatalf("long command: %v", err)
	}
	close(stopRenew)
	<-renewDone
	framework.Eventually(t, 30*time.Second, "the renewing sandbox to be reclaimed once it stops renewing", gone("renewing"))
	framework.Eventually(t, 30*time.Second, "the busy sandbox to be reclaimed after its command", gone("busy"))

	// Owner references: the trainer's pod owns its sandboxes.
	owner := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: p.ns},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{"sandman.io/pool": "nowhere"},
			Containers: []corev1.Container{{Name: "trainer", Image: s.BusyboxImage}}},
	}
	owner, err = s.Kube.CoreV1().Pods(p.ns).Create(ctx, owner, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p.create(p.newPod(fmt.Sprintf("owned-%d", i), s.BusyboxImage, func(pod *corev1.Pod) {
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID}}
		}))
	}
	for i := range 3 {
		p.waitPod(fmt.Sprintf("owned-%d", i), 2*time.Minute, "Ready", podReady)
	}
	if err := s.Kube.CoreV1().Pods(p.ns).Delete(ctx, owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		framework.Eventually(t, time.Minute, "garbage collection of owned-"+strconv.Itoa(i), gone(fmt.Sprintf("owned-%d", i)))
	}
	framework.Eventually(t, 30*time.Second, "every slot free", func(ctx context.Context) (bool, error) {
		b, err := p.boundSlots(ctx)
		return err == nil && len(b) == 0, nil
	})
}

// sandmanctl runs the sandmanctl binary against the stack.
func sandmanctl(t *testing.T, s *framework.Stack, bin, tokenDir string, args ...string) (string, string, int) {
	t.Helper()
	return runCommand(t, 3*time.Minute, []string{"SANDMAN_TOKEN="}, "", bin,
		append([]string{"--kubeconfig", s.Env["KUBECONFIG"], "--token-dir", tokenDir}, args...)...)
}

// TestSandmanctl: run, exec (exit codes), cp both ways, ls, rm, renew, get
// and delete against the real stack, with script-friendly exit codes.
func TestSandmanctl(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 4)
	bin := buildBinary(t, s.Root, "sandmanctl")
	tokens := t.TempDir()
	ctl := func(args ...string) (string, string, int) {
		return sandmanctl(t, s, bin, tokens, append([]string{"-n", p.ns}, args...)...)
	}
	out, errOut, code := ctl("run", "--pool", p.name, "--name", "box", "--idle-timeout", "10m", s.BusyboxImage)
	if code != 0 || !strings.HasPrefix(out, "box\t") {
		t.Fatalf("run: %d %q %q", code, out, errOut)
	}
	tokenFile := strings.TrimSpace(strings.SplitN(out, "\t", 2)[1])
	if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: %v %v", tokenFile, fi, err)
	}
	if out, _, code := ctl("exec", "box", "--", "sh", "-c", "echo hi; echo oops >&2; exit 5"); out != "hi\n" || code != 5 {
		t.Fatalf("exec: %q exit %d", out, code)
	}
	local := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(local, []byte("payload"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, e, code := ctl("cp", local, "box:/tmp/in.txt"); code != 0 {
		t.Fatalf("cp up: %d %s", code, e)
	}
	if out, _, _ := ctl("ls", "box:/tmp"); !strings.Contains(out, "in.txt") {
		t.Fatalf("ls: %q", out)
	}
	back := filepath.Join(t.TempDir(), "out.txt")
	if _, e, code := ctl("cp", "box:/tmp/in.txt", back); code != 0 {
		t.Fatalf("cp down: %d %s", code, e)
	}
	if b, err := os.ReadFile(back); err != nil || string(b) != "payload" {
		t.Fatalf("round trip: %q %v", b, err)
	}
	if _, e, code := ctl("rm", "box:/tmp/in.txt"); code != 0 {
		t.Fatalf("rm: %d %s", code, e)
	}
	if _, _, code := ctl("exec", "box", "--", "test", "-e", "/tmp/in.txt"); code != 1 {
		t.Fatalf("the removed file is still there (exit %d)", code)
	}
	if _, e, code := ctl("renew", "box"); code != 0 {
		t.Fatalf("renew: %d %s", code, e)
	}
	if out, _, code := ctl("get"); code != 0 || !strings.Contains(out, "box") || !strings.Contains(out, p.node) {
		t.Fatalf("get: %d %q", code, out)
	}
	// Script-friendly failures.
	if _, e, code := ctl("exec", "nosuch", "--", "true"); code != 3 {
		t.Fatalf("exec in a missing sandbox: exit %d (%s), want 3", code, e)
	}
	if err := os.WriteFile(tokenFile, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, e, code := ctl("exec", "box", "--", "true"); code != 4 {
		t.Fatalf("exec with a wrong token: exit %d (%s), want 4", code, e)
	}
	if _, _, code := ctl("frobnicate"); code != 2 {
		t.Fatalf("unknown command: exit %d, want 2", code)
	}
	if _, e, code := ctl("delete", "box"); code != 0 {
		t.Fatalf("delete: %d %s", code, e)
	}
	framework.Eventually(t, time.Minute, "the sandbox to be gone and its slot free", func(ctx context.Context) (bool, error) {
		_, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, "box", metav1.GetOptions{})
		b, berr := p.boundSlots(ctx)
		return apierrors.IsNotFound(err) && berr == nil && len(b) == 0, nil
	})
}

// TestVKExecTTY drives `kubectl exec -it` through a real terminal (tmux):
// the shell sees the terminal's size, answers, and follows a resize.
func TestVKExecTTY(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is needed (hack/install-deps.sh installs it): %v", err)
	}
	s := framework.Get(t)
	p := startPool(t, s, 1, 2)
	p.create(p.newPod("tty", s.BusyboxImage))
	p.waitPod("tty", 2*time.Minute, "Ready", podReady)
	session := "sandman-e2e-" + rand.String(5)
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v %s", args, err, out)
		}
		return string(out)
	}
	tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24",
		fmt.Sprintf("KUBECONFIG=%s %s -n %s exec -it tty -- sh", s.Env["KUBECONFIG"], s.Env["KUBECTL"], p.ns))
	t.Cleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", session).Run() })
	screenHas := func(what string, want ...string) {
		t.Helper()
		framework.Eventually(t, 30*time.Second, what, func(context.Context) (bool, error) {
			screen := tmux("capture-pane", "-p", "-t", session)
			for _, w := range want {
				if !strings.Contains(screen, w) {
					return false, nil
				}
			}
			return true, nil
		})
	}
	tmux("send-keys", "-t", session, "stty size; echo answer=$((6*7)); tty", "Enter")
	screenHas("the shell to answer on an 80×24 terminal", "24 80", "answer=42", "/dev/pts/")
	tmux("resize-window", "-t", session, "-x", "100", "-y", "30")
	tmux("send-keys", "-t", session, "clear; stty size", "Enter")
	screenHas("the resize to reach the shell", "30 100")
	tmux("send-keys", "-t", session, "exit", "Enter")
}

// TestVKTrainerKilled: a trainer that creates 50 sandboxes with owner
// references and an idle lease and is then killed with kill -9 leaves no
// sandbox once the lease passes, and every slot is free again.
func TestVKTrainerKilled(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 2, 26)
	ctx := t.Context()
	// The trainer's pod object (its process is the shell below); it stays,
	// as a crashed trainer's pod may, so the idle lease has to do the work.
	owner, err := s.Kube.CoreV1().Pods(p.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: p.ns},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{"sandman.io/pool": "nowhere"},
			Containers: []corev1.Container{{Name: "trainer", Image: s.BusyboxImage}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var manifest strings.Builder
	manifest.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	for i := range 50 {
		fmt.Fprintf(&manifest, `- apiVersion: v1
  kind: Pod
  metadata:
    name: rollout-%02d
    namespace: %s
    labels: {sandman.io/job: killed-trainer}
    annotations: {sandman.io/token-sha256: "%s", sandman.io/idle-timeout: 5s}
    ownerReferences: [{apiVersion: v1, kind: Pod, name: trainer, uid: %s}]
  spec:
    nodeSelector: {sandman.io/pool: %s}
    tolerations: [{key: sandman.io/pool, operator: Exists, effect: NoSchedule}]
    terminationGracePeriodSeconds: 1
    containers: [{name: task, image: "%s"}]
`, i, p.ns, trainerHash(), owner.UID, p.name, s.BusyboxImage)
	}
	file := filepath.Join(t.TempDir(), "rollouts.yaml")
	if err := os.WriteFile(file, []byte(manifest.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// The trainer says when kubectl has created all 50: counting the pods
	// would not do, as the first may be reclaimed (idle 5 s) before kubectl
	// creates the last on a slow machine (the count never reached 50 in a
	// CI run on cold caches).
	applied := filepath.Join(t.TempDir(), "applied")
	trainer := exec.Command("sh", "-c", fmt.Sprintf("%s apply -f %s && touch %s && exec sleep 600", s.Env["KUBECTL"], file, applied))
	trainer.Env = append(os.Environ(), "KUBECONFIG="+s.Env["KUBECONFIG"])
	var out bytes.Buffer
	trainer.Stdout, trainer.Stderr = &out, &out
	if err := trainer.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- trainer.Wait() }()
	t.Cleanup(func() { _ = trainer.Process.Kill() })
	framework.Eventually(t, time.Minute, "the trainer to create 50 sandboxes", func(ctx context.Context) (bool, error) {
		select {
		case err := <-exited:
			return false, fmt.Errorf("the trainer ended before its sleep (%v): %s", err, out.String())
		default:
		}
		_, err := os.Stat(applied)
		return err == nil, nil
	})
	_ = trainer.Process.Signal(syscall.SIGKILL)
	<-exited
	framework.Eventually(t, 4*time.Minute, "zero sandboxes after the idle lease", func(ctx context.Context) (bool, error) {
		l, err := s.Kube.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{LabelSelector: "sandman.io/job=killed-trainer"})
		return err == nil && len(l.Items) == 0, nil
	})
	framework.Eventually(t, time.Minute, "every slot back to warm", func(ctx context.Context) (bool, error) {
		b, err := p.boundSlots(ctx)
		return err == nil && len(b) == 0, nil
	})
	evs, err := s.Kube.CoreV1().Events(p.ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=IdleTimeout"})
	if err != nil || len(evs.Items) < 50 {
		t.Fatalf("%d IdleTimeout events, want 50 (%v)", len(evs.Items), err)
	}
}

// TestVKRestartPolicy: the main process is restarted in place as the pod's
// restartPolicy says — its files persist across restarts — and a pod whose
// command ends for good ends with its code.
func TestVKRestartPolicy(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 4)
	ctx := t.Context()
	// Fails twice, then succeeds: the count lives in the sandbox's files.
	const flaky = `n=$(cat /tmp/runs 2>/dev/null || echo 0); n=$((n+1)); echo $n > /tmp/runs; echo run $n; [ $n -ge 3 ]`
	withCmd := func(policy corev1.RestartPolicy, script string) func(*corev1.Pod) {
		return func(pod *corev1.Pod) {
			pod.Spec.RestartPolicy = policy
			pod.Spec.Containers[0].Command = []string{"sh", "-c", script}
		}
	}
	p.create(p.newPod("on-failure", s.BusyboxImage, withCmd(corev1.RestartPolicyOnFailure, flaky)))
	p.create(p.newPod("never", s.BusyboxImage, withCmd(corev1.RestartPolicyNever, "exit 3")))
	p.create(p.newPod("always", s.BusyboxImage, withCmd(corev1.RestartPolicyAlways, "echo once; sleep 0.2")))

	pod := p.waitPod("on-failure", time.Minute, "Succeeded after two restarts", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodSucceeded })
	if term := pod.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 0 {
		t.Fatalf("on-failure: %+v", pod.Status.ContainerStatuses[0].State)
	}
	pod = p.waitPod("never", time.Minute, "Failed", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
	if term := pod.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 3 {
		t.Fatalf("never: %+v", pod.Status.ContainerStatuses[0].State)
	}
	pod = p.waitPod("always", time.Minute, "Ready", podReady)
	c := daemonAt(t, pod.Status.PodIP, trainerToken)
	framework.Eventually(t, time.Minute, "the always pod's main process to be restarted", func(ctx context.Context) (bool, error) {
		h, err := c.Health(ctx)
		return err == nil && h.MainRestarts >= 2, nil
	})
	if got, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, "always", metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.PodRunning {
		t.Fatalf("always: %v %v", got.Status.Phase, err)
	}
}

// TestVKSandboxesCannotReachEachOther: from inside one sandbox, another
// sandbox's daemon cannot be reached at all (the sandbox firewall); it would
// also refuse this sandbox's token (and no token at all) with
// 401, and answers its own token only.
func TestVKSandboxesCannotReachEachOther(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 4)
	ctx := t.Context()
	tokenOf := map[string]string{"alice": "alice-token", "bob": "bob-token"}
	for name, tok := range tokenOf {
		sum := sha256.Sum256([]byte(tok))
		p.create(p.newPod(name, s.DebianImage, func(pod *corev1.Pod) {
			pod.Annotations["sandman.io/token-sha256"] = hex.EncodeToString(sum[:])
		}))
	}
	alice := p.waitPod("alice", 3*time.Minute, "Ready", podReady)
	bob := p.waitPod("bob", 3*time.Minute, "Ready", podReady)
	// Alice's sandbox calls Bob's daemon with Alice's token, then with none.
	probe := fmt.Sprintf(`
import urllib.request, urllib.error
for token in (%q, None):
    req = urllib.request.Request("http://%s:49983/v1/exec", data=b'{"cmd":["true"]}', headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        urllib.request.urlopen(req, timeout=5)
        print("accepted")
    except urllib.error.HTTPError as e:
        print(e.code)
    except urllib.error.URLError as e:
        print("blocked" if getattr(e.reason, "errno", None) == 113 else repr(e.reason))
`, tokenOf["alice"], bob.Status.PodIP)
	res, err := daemonAt(t, alice.Status.PodIP, tokenOf["alice"]).Exec(ctx, api.ExecRequest{Cmd: []string{"python3", "-c", probe}})
	if err != nil {
		t.Fatalf("probe from alice's sandbox: %v", err)
	}
	// The sandbox firewall stops the connection at alice's side ("no route
	// to host", at once); bob's daemon would answer 401 to either anyway.
	if string(res.Stdout) != "blocked\nblocked\n" {
		t.Fatalf("bob's daemon from alice's sandbox: stdout %q stderr %q, want both blocked by the firewall", res.Stdout, res.Stderr)
	}
	if _, err := daemonAt(t, bob.Status.PodIP, tokenOf["bob"]).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatalf("bob's own token: %v", err)
	}
}

// TestSandmanctlPrePull: `sandmanctl prepull` pins an image on every worker
// through the virtual node, shows each worker's progress and returns once
// it is ready everywhere; `sandmanctl images` lists it; a missing image
// fails the command with the registry's answer.
func TestSandmanctlPrePull(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 2, 2)
	bin := buildBinary(t, s.Root, "sandmanctl")
	ctl := func(args ...string) (string, string, int) {
		return sandmanctl(t, s, bin, t.TempDir(), args...)
	}
	img := pushRandomImage(t, s.Registry, "sandman-test/prepull", rand.String(8), 2, 1<<20, "", "")
	out, errOut, code := ctl("prepull", "--pool", p.name, img.Ref)
	if code != 0 || !strings.Contains(out, "ready on every node") {
		t.Fatalf("prepull: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, a := range p.agents {
		if !strings.Contains(out, a.name) {
			t.Errorf("prepull output does not show worker %s:\n%s", a.name, out)
		}
		st, err := a.client.ImageStatuses(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := statusOf(st, img.Ref); got.State != runtime.ImageReady || !got.Pinned {
			t.Errorf("%s reports %+v, want the image ready and pinned", a.name, got)
		}
	}
	out, errOut, code = ctl("images", "--pool", p.name)
	if code != 0 || strings.Count(out, img.Ref) != 2 {
		t.Fatalf("images: exit %d: want the image on both workers\n%s\n%s", code, out, errOut)
	}

	missing := s.Registry + "/sandman-test/missing:" + rand.String(6)
	out, errOut, code = ctl("prepull", "--pool", p.name, "--timeout", "1m", missing)
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("prepull of a missing image: exit %d\n%s\n%s", code, out, errOut)
	}
}
