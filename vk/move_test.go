package vk

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	nodev1listers "k8s.io/client-go/listers/node/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// TestMove: a running gVisor sandbox moved off its node says Moving until
// a bind restores it from its checkpoint on another node, then runs there
// Ready (events Moving, then Moved). A paused one moved off stays paused,
// held by no node, even through a reconcile; removing its pause annotation
// restores it on a node (event Resumed). A pod deleted while paused off any
// node has its checkpoint deleted.
func TestMove(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(100)
	h := newHarness(t, 3, func(c *Config) {
		c.RuntimeClasses, c.Recorder = nodev1listers.NewRuntimeClassLister(idx), rec
	})
	ctx := t.Context()
	rc := "gvisor"
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"run", "pz", "gone"} {
		pod := testPod(name, "img")
		pod.Spec.RuntimeClassName = &rc
		pods[name] = pod
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		h.wait(t, pod.UID, name+" ready", isReady)
	}
	ask := func(pod *corev1.Pod, paused bool) {
		t.Helper()
		pod = pod.DeepCopy()
		if paused {
			pod.Annotations[podcontract.AnnotationPause] = "true"
		} else {
			delete(pod.Annotations, podcontract.AnnotationPause)
		}
		if err := h.p.UpdatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	isPaused := func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Status == corev1.ConditionTrue && c.Reason == podcontract.ReasonPaused
	}
	for _, name := range []string{"pz", "gone"} {
		ask(pods[name], true)
		h.wait(t, pods[name].UID, name+" paused", isPaused)
	}

	// w2 joins empty once the pods run on w1, so the restores go there;
	// its restoring binds wait for the gate.
	gate := make(chan struct{})
	var once sync.Once
	openGate := func() { once.Do(func() { close(gate) }) }
	w2, err := fake.New(fake.Config{Node: "w2", Slots: 4, Images: []string{"img"}, IPBase: "10.9.1",
		FailBind: func(req runtime.BindRequest) error {
			if req.Restore != nil {
				<-gate
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w2.Close)
	t.Cleanup(openGate)
	h.pool.AddNode(ctx, "w2", w2)
	if err := h.pool.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	var events []string
	sawEvent := func(prefix string) int {
		i := -1
		poll(t, "event "+prefix, func() bool {
			select {
			case e := <-rec.Events:
				events = append(events, e)
			default:
			}
			i = slices.IndexFunc(events, func(e string) bool { return strings.HasPrefix(e, prefix) })
			return i >= 0
		})
		return i
	}
	offNode := func(uid types.UID) bool {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		sb := h.p.byUID[string(uid)]
		return sb != nil && sb.offNode
	}
	onANode := func(uid types.UID) bool {
		for _, n := range []*fake.Runtime{h.node, w2} {
			inv, _ := n.Inventory(ctx)
			for _, s := range inv.Slots {
				if s.Pod != nil && s.Pod.UID == string(uid) {
					return true
				}
			}
		}
		return false
	}

	// A running sandbox.
	run := pods["run"]
	const refRun = "reg.example/ckpt/ns/run@sha256:01"
	moved, err := h.node.MoveOut(string(run.UID), refRun)
	if err != nil {
		t.Fatal(err)
	}
	got := h.wait(t, run.UID, "run moving", func(p *corev1.Pod) bool { return p.Status.Reason == podcontract.ReasonMoving })
	if isReady(got) || got.Status.Phase != corev1.PodRunning {
		t.Errorf("moving pod: ready %v, phase %s", isReady(got), got.Status.Phase)
	}
	openGate()
	got = h.wait(t, run.UID, "run ready on w2", func(p *corev1.Pod) bool {
		return isReady(p) && strings.HasPrefix(p.Status.PodIP, "10.9.1.")
	})
	if got.Status.Reason != "" {
		t.Errorf("moved pod's status reason %q", got.Status.Reason)
	}
	if r := w2.Restores(); len(r) != 1 || r[0] != moved || moved.Paused || moved.From != "w1" {
		t.Errorf("w2 restored %+v, want %+v, not paused, from w1", r, moved)
	}
	if moving, done := sawEvent("Normal Moving"), sawEvent("Normal Moved the sandbox runs on node w2"); moving > done {
		t.Errorf("events %q: Moved before Moving", events)
	}

	// A paused sandbox.
	pz := pods["pz"]
	const refPz = "reg.example/ckpt/ns/pz@sha256:02"
	movedPz, err := h.node.MoveOut(string(pz.UID), refPz)
	if err != nil {
		t.Fatal(err)
	}
	if !movedPz.Paused {
		t.Errorf("pz moved %+v, want paused", movedPz)
	}
	poll(t, "pz off any node", func() bool { return offNode(pz.UID) && !onANode(pz.UID) })
	sawEvent("Normal Moved moved off node w1")
	// The reconciler submits pods that are not queued: not this one.
	h.p.reconcile(ctx)
	_, queued := h.pool.Queued(string(pz.UID))
	node, placed := h.pool.Placement(string(pz.UID))
	if queued || placed {
		t.Fatalf("pz, paused off any node, submitted by the reconciler (queued %v, placed on %q)", queued, node)
	}
	got = h.wait(t, pz.UID, "pz paused off any node", isPaused)
	if isReady(got) || got.Status.Reason != podcontract.ReasonPaused || got.Status.Phase != corev1.PodRunning {
		t.Errorf("paused pod moved: ready %v, reason %q, phase %s", isReady(got), got.Status.Reason, got.Status.Phase)
	}
	ask(pz, false)
	got = h.wait(t, pz.UID, "pz resumed on w2", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Status == corev1.ConditionFalse && c.Reason == podcontract.ReasonResumed && isReady(p) &&
			strings.HasPrefix(p.Status.PodIP, "10.9.1.")
	})
	if got.Status.Reason != "" {
		t.Errorf("resumed pod's status reason %q", got.Status.Reason)
	}
	if r := w2.Restores(); len(r) != 2 || r[1] != movedPz {
		t.Errorf("w2 restored %+v, want %+v last", r, movedPz)
	}
	sawEvent("Normal Resumed")

	// A paused sandbox deleted off any node.
	gone := pods["gone"]
	const refGone = "reg.example/ckpt/ns/gone@sha256:03"
	if _, err := h.node.MoveOut(string(gone.UID), refGone); err != nil {
		t.Fatal(err)
	}
	poll(t, "gone off any node", func() bool { return offNode(gone.UID) })
	del := gone.DeepCopy()
	grace := int64(0)
	del.DeletionGracePeriodSeconds = &grace
	if err := h.p.DeletePod(ctx, del); err != nil {
		t.Fatal(err)
	}
	poll(t, "gone's checkpoint deleted", func() bool {
		return slices.Contains(append(h.node.DeletedCheckpoints(), w2.DeletedCheckpoints()...), refGone)
	})
	if d := append(h.node.DeletedCheckpoints(), w2.DeletedCheckpoints()...); len(d) != 1 {
		t.Errorf("deleted checkpoints %v, want %s only", d, refGone)
	}
	if r := w2.Restores(); len(r) != 2 {
		t.Errorf("w2 restored %+v: the deleted pod's checkpoint too", r)
	}
}

// TestResumeWithNoRoomMoves: a paused sandbox whose node has no room to
// resume it (another pod took its requests) is moved off that node and
// its resume waits in the pool's queue like any bind (status Paused,
// waiting to resume); once room is freed it is restored from its
// checkpoint, Resumed.
func TestResumeWithNoRoomMoves(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	// Two slots: 2000m of CPU on the fake node.
	h := newHarness(t, 2, func(c *Config) { c.RuntimeClasses = nodev1listers.NewRuntimeClassLister(idx) })
	ctx := t.Context()
	rc := "gvisor"
	cpu := func(pod *corev1.Pod, q string) {
		pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(q)}
	}
	a := testPod("a", "img")
	a.Spec.RuntimeClassName = &rc
	cpu(a, "1")
	if err := h.p.CreatePod(ctx, a); err != nil {
		t.Fatal(err)
	}
	h.wait(t, a.UID, "a ready", isReady)
	paused := a.DeepCopy()
	paused.Annotations[podcontract.AnnotationPause] = "true"
	if err := h.p.UpdatePod(ctx, paused); err != nil {
		t.Fatal(err)
	}
	h.wait(t, a.UID, "a paused", func(p *corev1.Pod) bool { return p.Status.Reason == podcontract.ReasonPaused })
	// b takes what a's pause freed.
	b := testPod("b", "img")
	cpu(b, "1500m")
	if err := h.p.CreatePod(ctx, b); err != nil {
		t.Fatal(err)
	}
	h.wait(t, b.UID, "b ready", isReady)

	if err := h.p.UpdatePod(ctx, a); err != nil { // no pause annotation: resume
		t.Fatal(err)
	}
	poll(t, "a moved off its full node, queued to resume", func() bool {
		_, queued := h.pool.Queued(string(a.UID))
		return queued
	})
	got := h.wait(t, a.UID, "a waiting to resume", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return p.Status.Reason == podcontract.ReasonPaused && ok && c.Reason == podcontract.ReasonResuming &&
			strings.Contains(c.Message, "pool's queue")
	})
	if isReady(got) {
		t.Errorf("a is Ready while it waits to resume")
	}
	if r := h.node.Restores(); len(r) != 0 {
		t.Fatalf("restored before there was room: %+v", r)
	}
	del := b.DeepCopy()
	grace := int64(0)
	del.DeletionGracePeriodSeconds = &grace
	if err := h.p.DeletePod(ctx, del); err != nil {
		t.Fatal(err)
	}
	h.wait(t, a.UID, "a resumed", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Reason == podcontract.ReasonResumed && isReady(p)
	})
	if r := h.node.Restores(); len(r) != 1 || !r[0].Paused || r[0].From != "w1" {
		t.Errorf("restores %+v, want a's paused checkpoint from w1", r)
	}
}

// TestMovedPodAfterRestart: a virtual node that starts with pods whose
// sandboxes moved and that no node holds (their sandman.io/moved, written
// by the one before) takes them up instead of reporting them lost: a
// paused one stays paused off any node until it is resumed from its
// checkpoint, a running one is restored at once; once restored, the
// annotation goes.
func TestMovedPodAfterRestart(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, 3, func(c *Config) { c.RuntimeClasses = nodev1listers.NewRuntimeClassLister(idx) })
	ctx := t.Context()
	rc := "gvisor"
	movedPod := func(name string, paused bool) *corev1.Pod {
		pod := testPod(name, "img")
		pod.Spec.RuntimeClassName = &rc
		m := runtime.MovedCheckpoint{Ref: "reg.example/ckpt/ns/" + name + "@sha256:0" + name, Paused: paused, From: "w0", Bytes: 64 << 20}
		b, _ := json.Marshal(m)
		pod.Annotations[podcontract.AnnotationMoved] = string(b)
		if paused {
			pod.Annotations[podcontract.AnnotationPause] = "true"
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "task",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}}
		if _, err := h.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	annotated := func(pod *corev1.Pod) bool {
		cur, err := h.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, ok := cur.Annotations[podcontract.AnnotationMoved]
		return ok
	}

	run := movedPod("run", false)
	h.wait(t, run.UID, "run restored", isReady)
	if r := h.node.Restores(); len(r) != 1 || r[0].Ref != "reg.example/ckpt/ns/run@sha256:0run" {
		t.Errorf("restores %+v, want run's checkpoint", r)
	}
	poll(t, "run's sandman.io/moved removed", func() bool { return !annotated(run) })

	pz := movedPod("pz", true)
	got := h.wait(t, pz.UID, "pz paused off any node", func(p *corev1.Pod) bool {
		return p.Status.Reason == podcontract.ReasonPaused && p.Status.Phase == corev1.PodRunning
	})
	if isReady(got) {
		t.Errorf("pz is Ready while paused")
	}
	h.p.reconcile(ctx)
	_, queued := h.pool.Queued(string(pz.UID))
	if _, placed := h.pool.Placement(string(pz.UID)); queued || placed {
		t.Fatalf("pz, paused off any node, was submitted (queued %v, placed %v)", queued, placed)
	}
	resume := pz.DeepCopy()
	delete(resume.Annotations, podcontract.AnnotationPause)
	if err := h.p.UpdatePod(ctx, resume); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pz.UID, "pz resumed", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Reason == podcontract.ReasonResumed && isReady(p)
	})
	if r := h.node.Restores(); len(r) != 2 || r[1].Ref != "reg.example/ckpt/ns/pz@sha256:0pz" || !r[1].Paused {
		t.Errorf("restores %+v, want pz's paused checkpoint last", r)
	}

	// Paused when it moved, asked to run while no virtual node ran: it
	// is resumed when taken up.
	late := testPod("late", "img")
	late.Spec.RuntimeClassName = &rc
	b, _ := json.Marshal(runtime.MovedCheckpoint{Ref: "reg.example/ckpt/ns/late@sha256:0late", Paused: true, From: "w0"})
	late.Annotations[podcontract.AnnotationMoved] = string(b)
	late.Status = corev1.PodStatus{Phase: corev1.PodRunning}
	if err := h.p.CreatePod(ctx, late); err != nil {
		t.Fatal(err)
	}
	h.wait(t, late.UID, "late resumed", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Reason == podcontract.ReasonResumed && isReady(p)
	})
}

// TestMovedAnnotationOfAnotherPod: a pod whose sandman.io/moved names a
// checkpoint that is not its own — another namespace's, or another pod's
// of its namespace, which its tenant may write there — is neither
// restored from it (its tenant would run another's memory) nor has it
// deleted when the pod goes: it is lost, and says why.
func TestMovedAnnotationOfAnotherPod(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, 3, func(c *Config) { c.RuntimeClasses = nodev1listers.NewRuntimeClassLister(idx) })
	ctx := t.Context()
	rc := "gvisor"
	for _, tc := range []struct {
		name, ref string
		paused    bool
	}{
		{"paused-other-ns", "reg.example/ckpt/victims/v@sha256:0v", true},
		{"running-other-ns", "reg.example/ckpt/victims/v@sha256:0v", false},
		{"paused-other-pod", "reg.example/ckpt/ns/v@sha256:0v", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod(tc.name, "img")
			pod.Spec.RuntimeClassName = &rc
			b, _ := json.Marshal(runtime.MovedCheckpoint{Ref: tc.ref, Paused: tc.paused, From: "w0", Bytes: 64 << 20})
			pod.Annotations[podcontract.AnnotationMoved] = string(b)
			if tc.paused {
				pod.Annotations[podcontract.AnnotationPause] = "true"
			}
			pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "task",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}}
			if _, err := h.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := h.p.CreatePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			got := h.wait(t, pod.UID, "the pod taken up", func(p *corev1.Pod) bool {
				return p.Status.Phase == corev1.PodFailed || p.Status.Reason == podcontract.ReasonPaused || isReady(p)
			})
			if got.Status.Phase != corev1.PodFailed || got.Status.Reason != podcontract.ReasonSandboxLost ||
				!strings.Contains(got.Status.Message, podcontract.AnnotationMoved) {
				t.Errorf("status %s %q %q, want Failed, %s, saying why %s was refused", got.Status.Phase, got.Status.Reason, got.Status.Message,
					podcontract.ReasonSandboxLost, podcontract.AnnotationMoved)
			}

			del := pod.DeepCopy()
			del.DeletionTimestamp, del.DeletionGracePeriodSeconds = &metav1.Time{Time: time.Now()}, new(int64)
			if err := h.p.DeletePod(ctx, del); err != nil {
				t.Fatal(err)
			}
			poll(t, "the pod released", func() bool {
				h.p.mu.Lock()
				defer h.p.mu.Unlock()
				_, ok := h.p.byUID[string(pod.UID)]
				return !ok
			})
			if d := h.node.DeletedCheckpoints(); len(d) != 0 {
				t.Errorf("deleted checkpoints %v: another pod's", d)
			}
			if r := h.node.Restores(); len(r) != 0 {
				t.Errorf("restored %+v: another pod's", r)
			}
		})
	}
}

// TestMovePausedAfter: with MovePausedAfter, a sandbox paused that long is
// moved off its node at the next reconcile — it holds no slot — and its
// resume restores it from the checkpoint.
func TestMovePausedAfter(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, 2, func(c *Config) {
		c.RuntimeClasses, c.MovePausedAfter = nodev1listers.NewRuntimeClassLister(idx), time.Millisecond
	})
	ctx := t.Context()
	rc := "gvisor"
	a := testPod("a", "img")
	a.Spec.RuntimeClassName = &rc
	if err := h.p.CreatePod(ctx, a); err != nil {
		t.Fatal(err)
	}
	h.wait(t, a.UID, "a ready", isReady)
	h.p.reconcile(ctx) // running: nothing to move
	paused := a.DeepCopy()
	paused.Annotations[podcontract.AnnotationPause] = "true"
	if err := h.p.UpdatePod(ctx, paused); err != nil {
		t.Fatal(err)
	}
	h.wait(t, a.UID, "a paused", func(p *corev1.Pod) bool { return p.Status.Reason == podcontract.ReasonPaused })
	if inv, _ := h.node.Inventory(ctx); inv.Count()[runtime.StatePaused] != 1 {
		t.Fatalf("the paused sandbox is not paused on its node: %v", inv.Count())
	}
	poll(t, "a moved off its node", func() bool {
		h.p.reconcile(ctx)
		h.p.mu.Lock()
		off := h.p.byUID[string(a.UID)].offNode
		h.p.mu.Unlock()
		inv, _ := h.node.Inventory(ctx)
		return off && inv.Count()[runtime.StatePaused] == 0
	})
	if err := h.p.UpdatePod(ctx, a); err != nil {
		t.Fatal(err)
	}
	h.wait(t, a.UID, "a resumed", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Reason == podcontract.ReasonResumed && isReady(p)
	})
	if r := h.node.Restores(); len(r) != 1 || !r[0].Paused {
		t.Errorf("restores %+v, want a's paused checkpoint", r)
	}
}
