package vk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	kfake "k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	ktesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// harness is a provider over a pool of fake node agents, with client-go's
// fake clientset and the statuses it pushes.
type harness struct {
	p      *Provider
	pool   *pool.Pool
	client *kfake.Clientset
	node   *fake.Runtime

	mu       sync.Mutex
	statuses map[types.UID]*corev1.Pod
	// reasons: every waiting reason pushed per pod, in order.
	reasons map[types.UID][]string
}

func newHarness(t *testing.T, slots int, mutate ...func(*Config)) *harness {
	t.Helper()
	return newHarnessWith(t, slots, nil, mutate...)
}

// newHarnessWith is newHarness with the fake node agent seen through wrap.
func newHarnessWith(t *testing.T, slots int, wrap func(*fake.Runtime) runtime.Runtime, mutate ...func(*Config)) *harness {
	t.Helper()
	h := &harness{client: kfake.NewClientset(), statuses: map[types.UID]*corev1.Pod{}, reasons: map[types.UID][]string{}}
	var err error
	h.node, err = fake.New(fake.Config{Node: "w1", Slots: slots, Images: []string{"img"}, IPBase: "10.9.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.node.Close)
	h.pool, err = pool.New(pool.Config{Name: "t", OnUpdate: func(u pool.Update) { h.p.OnUpdate(u) }})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeName: "vn", Pool: h.pool, Client: h.client, NodeIP: "10.0.0.1", ControlKeys: mustKeys("s")}
	for _, m := range mutate {
		m(&cfg)
	}
	h.p, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	poolDone := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-poolDone
		h.p.Close()
	})
	h.p.NotifyPods(ctx, func(pod *corev1.Pod) {
		h.mu.Lock()
		h.statuses[pod.UID] = pod
		for _, cs := range pod.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				h.reasons[pod.UID] = append(h.reasons[pod.UID], w.Reason)
			}
		}
		h.mu.Unlock()
	})
	go func() { _ = h.pool.Run(ctx); close(poolDone) }()
	var node runtime.Runtime = h.node
	if wrap != nil {
		node = wrap(h.node)
	}
	h.pool.AddNode(ctx, "w1", node)
	if err := h.pool.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// poll calls cond every 5 ms until it holds, failing with what after 10 s.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// warmSlots is how many of the fake node's slots are warm.
func (h *harness) warmSlots(t *testing.T) int {
	inv, _ := h.node.Inventory(t.Context())
	return inv.Count()[runtime.StateWarm]
}

// wait polls the last pushed status of uid until cond holds.
func (h *harness) wait(t *testing.T, uid types.UID, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.mu.Lock()
		pod := h.statuses[uid]
		h.mu.Unlock()
		if pod != nil && cond(pod) {
			return pod
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last status: %+v", what, pod)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mustKeys is a control key set of current and previous keys.
func mustKeys(current string, previous ...string) *ControlKeys {
	var prev [][]byte
	for _, p := range previous {
		prev = append(prev, []byte(p))
	}
	k, err := NewControlKeys([]byte(current), prev...)
	if err != nil {
		panic(err)
	}
	return k
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func testPod(name, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Annotations: map[string]string{podcontract.AnnotationTokenSHA256: sha("t")}},
		Spec: corev1.PodSpec{NodeName: "vn", Containers: []corev1.Container{{Name: "task", Image: image,
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}}}}},
	}
}

func isReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func TestCreatePodBecomesReady(t *testing.T) {
	h := newHarness(t, 2)
	pod := testPod("a", "img")
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	got := h.wait(t, pod.UID, "Ready", isReady)
	cs := got.Status.ContainerStatuses
	switch {
	case got.Status.Phase != corev1.PodRunning:
		t.Fatalf("phase %s", got.Status.Phase)
	case !strings.HasPrefix(got.Status.PodIP, "10.9.0."), got.Status.HostIP != "10.0.0.1":
		t.Fatalf("pod IP %q host IP %q", got.Status.PodIP, got.Status.HostIP)
	case len(cs) != 1 || !cs[0].Ready || cs[0].State.Running == nil || !strings.HasPrefix(cs[0].ContainerID, "containerd://w1-"):
		t.Fatalf("container statuses %+v", cs)
	case got.UID != pod.UID:
		t.Fatalf("status for UID %s, want %s", got.UID, pod.UID)
	}
	// The node agent got the creator's token hash and the control plane's.
	inv, _ := h.node.Inventory(t.Context())
	if inv.Count()[runtime.StateBound] != 1 {
		t.Fatalf("node slots %v", inv.Count())
	}
	// GetPod and GetPods see it; CreatePod again is harmless.
	if p, err := h.p.GetPod(t.Context(), "ns", "a"); err != nil || p.UID != pod.UID {
		t.Fatalf("GetPod: %v %v", p, err)
	}
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if inv, _ := h.node.Inventory(t.Context()); inv.Count()[runtime.StateBound] != 1 {
		t.Fatalf("a second CreatePod bound again: %v", inv.Count())
	}
}

func TestPodsWaitForASlotAndNeverFailForABurst(t *testing.T) {
	h := newHarness(t, 1)
	a, b := testPod("a", "img"), testPod("b", "img")
	for _, pod := range []*corev1.Pod{a, b} {
		if err := h.p.CreatePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	}
	h.wait(t, a.UID, "a Ready", isReady)
	got := h.wait(t, b.UID, "b waiting for a slot", func(p *corev1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "WaitingForSlot"
	})
	if got.Status.Phase != corev1.PodPending || !strings.Contains(got.Status.ContainerStatuses[0].State.Waiting.Message, "waits for a slot") {
		t.Fatalf("waiting pod: %s %+v", got.Status.Phase, got.Status.ContainerStatuses[0].State.Waiting)
	}
	// GetPod includes waiting pods (so virtual-kubelet calls DeletePod).
	if _, err := h.p.GetPod(t.Context(), "ns", "b"); err != nil {
		t.Fatalf("GetPod of a waiting pod: %v", err)
	}
	// Deleting a frees its slot for b.
	del := a.DeepCopy()
	grace := int64(0)
	del.DeletionGracePeriodSeconds = &grace
	if err := h.p.DeletePod(t.Context(), del); err != nil {
		t.Fatal(err)
	}
	if err := h.p.DeletePod(t.Context(), del); err != nil {
		t.Fatalf("DeletePod twice: %v", err)
	}
	h.wait(t, b.UID, "b Ready after a's release", isReady)
	poll(t, "the deleted pod to be forgotten", func() bool {
		_, err := h.p.GetPod(t.Context(), "ns", "a")
		return vkerrdefs.IsNotFound(err)
	})
}

func TestBadPodsFailWithAReason(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*corev1.Pod)
		want   string
	}{
		{"no token", func(p *corev1.Pod) { p.Annotations = nil }, "sandman.io/token-sha256"},
		{"bad token hash", func(p *corev1.Pod) { p.Annotations[podcontract.AnnotationTokenSHA256] = "xyz" }, "64 hex digits"},
		{"tiny memory", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Mi")}
		}, "4 MiB"},
		{"init containers", func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "img"}} }, "init containers"},
		{"privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}, "spec.containers[task].securityContext.privileged"},
		{"hostPath volume", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		}, "spec.volumes[host].hostPath"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1)
			pod := testPod("bad", "img")
			tc.mutate(pod)
			if err := h.p.CreatePod(t.Context(), pod); err != nil {
				t.Fatal(err)
			}
			got := h.wait(t, pod.UID, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
			if got.Status.Reason != runtime.ReasonInvalidSpec || !strings.Contains(got.Status.Message, tc.want) {
				t.Fatalf("reason %q message %q, want %q in it", got.Status.Reason, got.Status.Message, tc.want)
			}
		})
	}
}

func TestUnauthenticatedWhenAllowed(t *testing.T) {
	h := newHarness(t, 1, func(c *Config) { c.AllowUnauthenticated = true })
	pod := testPod("open", "img")
	pod.Annotations = nil
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)
}

func TestImageErrorsShowAndBackOff(t *testing.T) {
	h := newHarness(t, 1)
	pod := testPod("missing", "img:missing")
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	got := h.wait(t, pod.UID, "ErrImagePull", func(p *corev1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == runtime.ReasonErrImagePull
	})
	if got.Status.Phase != corev1.PodPending || !strings.Contains(got.Status.ContainerStatuses[0].State.Waiting.Message, "not found") {
		t.Fatalf("status %+v", got.Status)
	}
	// The slot is free for others while the image pull backs off.
	ok := testPod("ok", "img")
	if err := h.p.CreatePod(t.Context(), ok); err != nil {
		t.Fatal(err)
	}
	h.wait(t, ok.UID, "the other pod Ready", isReady)
}

func TestExitEndsThePodAndFreesTheSlot(t *testing.T) {
	h := newHarness(t, 1)
	pod := testPod("job", "img")
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)
	h.p.OnUpdate(pool.Update{Kind: pool.Exited, UID: string(pod.UID), Node: "w1", Container: "task", ExitCode: 3, Time: time.Now()})
	got := h.wait(t, pod.UID, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	term := got.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 3 || term.Reason != runtime.ReasonError {
		t.Fatalf("terminated state %+v", term)
	}
	poll(t, "the slot freed after the sandbox ended", func() bool { return h.warmSlots(t) == 1 })
}

func TestNodeCapacityIsThePools(t *testing.T) {
	h := newHarness(t, 3)
	np := &nodeProvider{Config: nodeConfig{Name: "vn", PoolName: "t", IP: "10.0.0.1", KubeletPort: 10250}, Pool: h.pool}
	capa, agents := np.Capacity()
	n := nodeSpec(np.Config, capa, agents)
	if n.Status.Capacity.Pods().Value() != 3 || n.Status.Allocatable.Cpu().MilliValue() != 3000 || agents != 1 {
		t.Fatalf("capacity %v allocatable %v agents %d", n.Status.Capacity, n.Status.Allocatable, agents)
	}
	if n.Labels[podcontract.LabelPool] != "t" || n.Labels["type"] != "virtual-kubelet" || n.Labels["kubernetes.io/os"] != "linux" {
		t.Fatalf("labels %v", n.Labels)
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != podcontract.LabelPool {
		t.Fatalf("taints %v", n.Spec.Taints)
	}
}

func TestJobOf(t *testing.T) {
	ctrl := true
	for _, tc := range []struct {
		pod  corev1.Pod
		want string
	}{
		{corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Labels: map[string]string{podcontract.LabelJob: "j1"}}}, "n/j1"},
		{corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "n", OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: "train", Controller: &ctrl}}}}, "n/Job/train"},
		{corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "n"}}, "n"},
	} {
		if got := jobOf(&tc.pod); got != tc.want {
			t.Errorf("jobOf = %q, want %q", got, tc.want)
		}
	}
}

// TestActiveDeadlineFailsThePod moves the provider's clock past the pod's
// deadline: its timer fires, with no wait.
func TestActiveDeadlineFailsThePod(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, 1, func(c *Config) { c.Clock = clk })
	pod := testPod("deadline", "img")
	ads := int64(600)
	pod.Spec.ActiveDeadlineSeconds = &ads
	pod.CreationTimestamp = metav1.NewTime(clk.Now())
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)
	clk.Step(599 * time.Second)
	if p, _ := h.p.GetPod(t.Context(), "ns", "deadline"); p.Status.Phase != corev1.PodRunning {
		t.Fatalf("phase %s a second before the deadline", p.Status.Phase)
	}
	clk.Step(time.Second)
	got := h.wait(t, pod.UID, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if got.Status.Reason != podcontract.ReasonDeadlineExceeded || !strings.Contains(got.Status.Message, "deadline") {
		t.Fatalf("reason %q message %q", got.Status.Reason, got.Status.Message)
	}
	poll(t, "the slot freed after the deadline", func() bool { return h.warmSlots(t) == 1 })
}

// flakyRelease is a node agent whose first failures releases fail.
type flakyRelease struct {
	*fake.Runtime
	failures int32
	calls    atomic.Int32
}

func (f *flakyRelease) Release(ctx context.Context, uid string, grace time.Duration) error {
	if f.calls.Add(1) <= f.failures {
		return fmt.Errorf("release %s: %w", uid, errdefs.ErrUnavailable)
	}
	return f.Runtime.Release(ctx, uid, grace)
}

// TestReleaseRetriesOnTheClock: a release that fails is retried after a
// back-off on the provider's clock, which the test moves instead of
// waiting; the deleted pod is forgotten once it succeeds.
func TestReleaseRetriesOnTheClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var node *flakyRelease
	h := newHarnessWith(t, 1, func(r *fake.Runtime) runtime.Runtime {
		node = &flakyRelease{Runtime: r, failures: 2}
		return node
	}, func(c *Config) { c.Clock = clk })
	pod := testPod("flaky", "img")
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)
	if err := h.p.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	poll(t, "the first release attempt", func() bool { return node.calls.Load() >= 1 })
	if _, err := h.p.GetPod(t.Context(), "ns", "flaky"); err != nil {
		t.Fatalf("the pod was forgotten though its release failed: %v", err)
	}
	// The back-off doubles from 200 ms: a second per step covers each.
	poll(t, "the deleted pod to be forgotten after two retries", func() bool {
		clk.Step(time.Second)
		_, err := h.p.GetPod(t.Context(), "ns", "flaky")
		return vkerrdefs.IsNotFound(err)
	})
	if n := node.calls.Load(); n != 3 {
		t.Fatalf("%d release calls, want 3 (two failures, then success)", n)
	}
	poll(t, "the slot freed", func() bool { return h.warmSlots(t) == 1 })
}

// TestCloseStopsReleaseRetries: a release that keeps failing waits for its
// next try on the clock; Close ends it instead of leaving it behind (the
// package's leak check fails otherwise).
func TestCloseStopsReleaseRetries(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var node *flakyRelease
	h := newHarnessWith(t, 1, func(r *fake.Runtime) runtime.Runtime {
		node = &flakyRelease{Runtime: r, failures: 1 << 30}
		return node
	}, func(c *Config) { c.Clock = clk })
	pod := testPod("stuck", "img")
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)
	if err := h.p.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	poll(t, "a failed release", func() bool { return node.calls.Load() >= 1 })
	h.p.Close()
	if _, err := h.p.GetPod(t.Context(), "ns", "stuck"); err != nil {
		t.Fatalf("a pod whose release never succeeded was forgotten: %v", err)
	}
}

// A node status someone else changed (Ready Unknown, as
// kube-controller-manager writes after a long apiserver outage) is pushed
// again within the resync interval; a Ready one is not.
func TestNodeStatusRewrittenWhenMarkedNotReady(t *testing.T) {
	h := newHarness(t, 3)
	cfg := nodeConfig{Name: "vn", PoolName: "t", IP: "10.0.0.1", KubeletPort: 10250}
	capa, agents := (&nodeProvider{Config: cfg, Pool: h.pool}).Capacity()
	n := nodeSpec(cfg, capa, agents)
	if _, err := h.client.CoreV1().Nodes().Create(t.Context(), &n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	np := &nodeProvider{Config: cfg, Pool: h.pool, Nodes: h.client.CoreV1().Nodes(), Interval: 5 * time.Millisecond, ResyncInterval: 5 * time.Millisecond}
	var pushes atomic.Int32
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	np.NotifyNodeStatus(ctx, func(*corev1.Node) { pushes.Add(1) })
	poll(t, "the first push", func() bool { return pushes.Load() == 1 })
	// Many resync rounds with the node Ready: no push.
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		return pushes.Load() != 1, nil
	}); err == nil {
		t.Fatalf("%d pushes while the node was Ready in the API", pushes.Load())
	}
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			n.Status.Conditions[i].Status, n.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
		}
	}
	if _, err := h.client.CoreV1().Nodes().UpdateStatus(t.Context(), &n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "a push after the node was marked Unknown", func() bool { return pushes.Load() > 1 })
}

// A pod's sandman.io/expires-at deletes it then; moved later while the pod
// runs (E2B's setTimeout), the old time passes and nothing happens.
func TestExpiresAtReclaimsAndMoves(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, 1, func(c *Config) { c.Clock = clk })
	pod := testPod("expiring", "img")
	pod.Annotations[podcontract.AnnotationExpiresAt] = clk.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	if _, err := h.client.CoreV1().Pods("ns").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)
	moved := pod.DeepCopy()
	moved.Annotations[podcontract.AnnotationExpiresAt] = clk.Now().Add(3 * time.Minute).UTC().Format(time.RFC3339)
	if err := h.p.UpdatePod(t.Context(), moved); err != nil {
		t.Fatal(err)
	}
	exists := func() bool {
		_, err := h.client.CoreV1().Pods("ns").Get(t.Context(), "expiring", metav1.GetOptions{})
		return err == nil
	}
	clk.Step(2 * time.Minute)
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		return !exists(), nil
	}); err == nil {
		t.Fatal("the pod was deleted at the expiry it had before it was moved")
	}
	clk.Step(time.Minute + time.Second)
	poll(t, "the pod deleted at its moved expiry", func() bool { return !exists() })

	bad := testPod("bad-expiry", "img")
	bad.Annotations[podcontract.AnnotationExpiresAt] = "in an hour"
	if err := h.p.CreatePod(t.Context(), bad); err != nil {
		t.Fatal(err)
	}
	got := h.wait(t, bad.UID, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if !strings.Contains(got.Status.Message, podcontract.AnnotationExpiresAt) {
		t.Fatalf("message %q does not name the annotation", got.Status.Message)
	}
}

// The informer's view of a deletion releases the slot on its own, without
// virtual-kubelet's DeletePod; updates of pods not being deleted do not.
func TestDeletionHandlerReleasesWhatTheInformerSeesDeleted(t *testing.T) {
	// The informer's cache, as the provider reads it: it still holds a
	// (its grace-0 deletion is seen as an update first) and c; b is gone.
	a, b, c := testPod("a", "img"), testPod("b", "img"), testPod("c", "img")
	informed := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, pod := range []*corev1.Pod{a, c} {
		if err := informed.Add(pod); err != nil {
			t.Fatal(err)
		}
	}
	h := newHarness(t, 1, func(c *Config) { c.Pods = corev1listers.NewPodLister(informed) })
	handler := h.p.DeletionHandler()
	for _, pod := range []*corev1.Pod{a, b, c} {
		if err := h.p.CreatePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	}
	h.wait(t, a.UID, "a Ready", isReady)
	// An update of a running pod and the deletion of a pod the provider
	// never had change nothing.
	handler.OnUpdate(a, a.DeepCopy())
	handler.OnDelete(testPod("stranger", "img"))
	h.p.mu.Lock()
	deleting := h.p.byUID[string(a.UID)].deleting
	h.p.mu.Unlock()
	if deleting {
		t.Fatal("an update without a deletion timestamp started a release")
	}

	// a is marked for deletion (graceful): its release starts, b gets the slot.
	marked := a.DeepCopy()
	marked.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	marked.DeletionGracePeriodSeconds = ptr.To(int64(0))
	handler.OnUpdate(a, marked)
	h.wait(t, b.UID, "b Ready after a's deletion was seen", isReady)
	if marked.DeletionGracePeriodSeconds == nil || *marked.DeletionGracePeriodSeconds != 0 {
		t.Fatal("the informer's object was changed")
	}
	// virtual-kubelet's own DeletePod, later, finds the release under way.
	if err := h.p.DeletePod(t.Context(), marked); err != nil && !vkerrdefs.IsNotFound(err) {
		t.Fatalf("DeletePod after the handler: %v", err)
	}

	// The apiserver removes a pod deleted with grace 0 itself: no DELETE
	// of a's follows.
	poll(t, "a forgotten", func() bool {
		_, err := h.p.GetPod(t.Context(), "ns", "a")
		return vkerrdefs.IsNotFound(err)
	})

	// b is deleted at once and the watch missed it (a tombstone).
	handler.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/b", Obj: b.DeepCopy()})
	h.wait(t, c.UID, "c Ready after b's deletion was seen", isReady)

	// c is deleted gracefully: once its sandbox is gone the provider
	// finishes the deletion, as a kubelet does.
	graceful := c.DeepCopy()
	graceful.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(5 * time.Second)}
	graceful.DeletionGracePeriodSeconds = ptr.To(int64(5))
	handler.OnUpdate(c, graceful)
	poll(t, "c's deletion finished", func() bool {
		_, err := h.p.GetPod(t.Context(), "ns", "c")
		return vkerrdefs.IsNotFound(err)
	})
	var deleted []string
	for _, a := range h.client.Actions() {
		if d, ok := a.(ktesting.DeleteAction); ok && d.GetResource().Resource == "pods" {
			deleted = append(deleted, d.GetName())
		}
	}
	if !slices.Equal(deleted, []string{"c"}) {
		t.Fatalf("pods deleted in the API: %v, want only the gracefully deleted c", deleted)
	}
}

// Statuses that only say a pod waits for a slot are paced apart from the
// others, and dropped for a pod that got its slot first.
func TestWaitingStatusesArePacedAndDroppedOnceStale(t *testing.T) {
	h := newHarness(t, 1, func(c *Config) { c.WaitingStatusQPS = 0.001 }) // a burst of 1, then one per 1,000 s
	a, x, b := testPod("a", "img"), testPod("x", "img"), testPod("b", "img")
	for _, pod := range []*corev1.Pod{a, x, b} {
		if err := h.p.CreatePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
		if pod == a {
			h.wait(t, a.UID, "a Ready", isReady)
		}
	}
	// x took the lane's burst: it is told it waits.
	h.wait(t, x.UID, "x waiting for a slot", func(p *corev1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "WaitingForSlot"
	})
	// a and then x are deleted; b gets the slot before the lane reaches it.
	for _, pod := range []*corev1.Pod{a, x} {
		if err := h.p.DeletePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	}
	h.wait(t, b.UID, "b Ready", isReady)
	h.mu.Lock()
	defer h.mu.Unlock()
	if slices.Contains(h.reasons[b.UID], "WaitingForSlot") {
		t.Fatalf("b was told it waits for a slot after the lane's burst was spent: %v", h.reasons[b.UID])
	}
}

// TestAwaitPullSecrets: a pod's pull Secret that the API has but the
// informer has not yet is waited for until the informer has it; one the
// API does not have either is not waited for.
func TestAwaitPullSecrets(t *testing.T) {
	informed := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	h := newHarness(t, 1, func(c *Config) { c.Secrets = corev1listers.NewSecretLister(informed) })
	ctx := t.Context()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pull"}}
	if _, err := h.client.CoreV1().Secrets("ns").Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := testPod("private", "img")
	pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "pull"}}
	const lag = 300 * time.Millisecond
	go func() {
		time.Sleep(lag) // the informer's lag, simulated
		_ = informed.Add(sec)
	}()
	begin := time.Now()
	h.p.awaitPullSecrets(ctx, pod)
	if took := time.Since(begin); took < lag || took >= pullSecretWait {
		t.Errorf("waited %v for a Secret the informer had after %v", took, lag)
	}
	if _, err := corev1listers.NewSecretLister(informed).Secrets("ns").Get("pull"); err != nil {
		t.Errorf("returned before the informer had it: %v", err)
	}

	missing := testPod("missing", "img")
	missing.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "none"}}
	begin = time.Now()
	h.p.awaitPullSecrets(ctx, missing)
	if took := time.Since(begin); took > time.Second {
		t.Errorf("waited %v for a Secret that does not exist", took)
	}
}
