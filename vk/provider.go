package vk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	nodev1listers "k8s.io/client-go/listers/node/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/internal/lifecycle"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// Config configures a Provider.
type Config struct {
	// NodeName is the virtual node's name; Pool its pool's.
	NodeName string
	Pool     *pool.Pool
	// QueueRoom is the room beyond its slots the node advertises
	// (nodeConfig.QueueRoom), shown on the capacity page.
	QueueRoom int
	// Client writes pod deletions after a sandbox's release (as a kubelet
	// does); Pods and Secrets are listers from the node's informers.
	Client  kubernetes.Interface
	Pods    corev1listers.PodLister
	Secrets corev1listers.SecretLister
	// RuntimeClasses resolve a pod's runtimeClassName to its handler (nil:
	// pods that name one fail).
	RuntimeClasses nodev1listers.RuntimeClassLister
	// Recorder records the events that say why a pod waits, fails or is
	// reclaimed.
	Recorder record.EventRecorder
	// NodeIP is the virtual node's address (the pods' host IP).
	NodeIP string
	// AllowUnauthenticated lets pods without a token hash run without auth;
	// otherwise they fail with a message saying what to add.
	AllowUnauthenticated bool
	// ControlKeys derive the control plane's own per-sandbox tokens
	// (ControlToken): the current key for new sandboxes, previous ones
	// still tried; a change of the current key re-keys running sandboxes
	// (rekey.go). Nil: none.
	ControlKeys *ControlKeys
	// AutoPauseAfter pauses a gVisor sandbox that has been idle that long
	// (no daemon call, nothing running; asked at each reconcile) instead
	// of leaving it to hold its slot's memory: its pod's AnnotationPause
	// becomes PauseIdle, and the next kubectl exec resumes it. 0: off.
	AutoPauseAfter time.Duration
	// MovePausedAfter moves a sandbox paused that long off its node
	// (Pool.Move; its node agents need a checkpoint repository): it then
	// holds no slot either, and its resume is a bind on any node. 0: off
	// (a paused sandbox keeps its slot and address until resumed).
	MovePausedAfter time.Duration
	// KeepPaused is how long a sandbox paused at its expiry
	// (podcontract.AnnotationOnExpiry "pause") is kept before it is
	// deleted (default 24 h).
	KeepPaused time.Duration
	// ReconcileInterval is how often slots and pods are compared (default
	// 10 s); OrphanGrace how long a slot whose pod is gone is kept before
	// it is released (default 30 s).
	ReconcileInterval, OrphanGrace time.Duration
	// StatusWorkers turn changes into pod statuses (default 16).
	StatusWorkers int
	// WaitingStatusQPS paces the statuses and events that only say a pod
	// waits for a slot (default 20 a second, bursts of 4× that): they
	// queue apart from the others, so a burst's Ready statuses do not wait
	// behind thousands of them, and are dropped when the pod stopped
	// waiting first. Negative: no pacing.
	WaitingStatusQPS float64
	Logger           *slog.Logger
	// Clock tells the time and runs the provider's timers and tickers:
	// deadlines, retries, the reconciler, delayed status pushes (default
	// clock.RealClock). Tests pass a fake clock and move it.
	Clock
	// DefaultLimits are the limits of a container that sets none (cpu,
	// memory, ephemeral-storage; absent: none); a container whose request
	// or limit is above MaxLimits is refused (absent: no maximum).
	// Requests still default to the pod's own limits only, so a pod
	// without requests takes no reserved share of a worker.
	DefaultLimits, MaxLimits corev1.ResourceList
	// PidsLimit bounds each container's processes (0: the node agent's
	// limit; the lower of the two applies).
	PidsLimit int64
	// AllowedNamespaces and AllowedNamespaceSelector are the pool's access
	// rule: a pod may be placed on the pool when its namespace is named in
	// AllowedNamespaces or its labels match AllowedNamespaceSelector; any
	// other fails (podcontract.ReasonNamespaceNotAllowed) whatever way it reached the
	// virtual node. Neither set: every namespace may. Namespaces reads the
	// namespaces' labels (required with a selector).
	AllowedNamespaces        []string
	AllowedNamespaceSelector labels.Selector
	Namespaces               corev1listers.NamespaceLister
	// DefaultBandwidth caps the traffic of a sandbox whose pod sets no
	// podcontract.AnnotationIngressBandwidth / podcontract.AnnotationEgressBandwidth (zero: none;
	// with no default, the maximum); a pod that asks for more than
	// MaxBandwidth is refused (zero: no maximum).
	DefaultBandwidth, MaxBandwidth Bandwidth
	// SeccompLocalhostProfiles are the Localhost seccomp profiles pods may
	// name (paths relative to the node's profile directory); a pod naming
	// any other fails InvalidSpec. None: no Localhost profile.
	SeccompLocalhostProfiles []string
	// HostUsersNamespaces are the namespaces whose pods may set
	// hostUsers: true, the opt-out of the user namespace (root in the
	// sandbox is then root on the worker, capabilities cut); any other's
	// fail InvalidSpec. None: no pod may.
	HostUsersNamespaces []string
	// PrivilegeEscalationNamespaces are the namespaces whose pods may set
	// allowPrivilegeEscalation: true: the sandbox then runs without
	// no_new_privs, so setuid programs (sudo, as E2B's base template
	// expects) work. Root reached so is the sandbox's own root, with the
	// same capabilities, seccomp profile and user namespace as any
	// process the daemon runs as root. Any other namespace's fail
	// InvalidSpec. None: no pod may.
	PrivilegeEscalationNamespaces []string
	// DialDaemon dials sandbox daemons (default: TCP with a 5 s timeout);
	// tests point it at daemons of their own.
	DialDaemon func(ctx context.Context, network, addr string) (net.Conn, error)
	// SelfUsage, when set, is the virtual node's own CPU time and memory
	// (sandman-vk's process): they count in the node's figures, as a
	// kubelet's node figures count the kubelet, so a node with no sandbox
	// does not read zero (metrics-server drops nodes that read zero).
	SelfUsage func() (cpuNanos, memoryBytes uint64)
	// UsageInterval is how often each running sandbox's resource use is
	// sampled for GET /sandman/v1/usage (usage.go; default 5 s, negative:
	// never); UsageRate caps the readings a second (default 500).
	UsageInterval time.Duration
	UsageRate     float64
}

// Clock is what the provider reads the time from and arms timers with.
type Clock = clock.WithTickerAndDelayedExecution

// Provider is the virtual-kubelet provider: pods in, pool placements and
// pod statuses out. Create it with New, feed it pool updates through
// OnUpdate (pool.Config.OnUpdate), run it with Run, and Close it once Run
// and virtual-kubelet's controllers have returned.
type Provider struct {
	cfg    Config
	log    *slog.Logger
	status workqueue.TypedRateLimitingInterface[string]
	// waiting: pods to tell they wait for a slot (WaitingStatusQPS).
	waiting workqueue.TypedRateLimitingInterface[string]
	// daemonHTTP carries every call to sandbox daemons (idle checks,
	// kubectl exec and logs): one connection pool rather than one per call,
	// whose idle connections would each linger until their timeout.
	daemonHTTP *http.Client

	// ctx ends at Close: background work (releases and their retries)
	// runs under it.
	ctx    context.Context
	cancel context.CancelFunc
	// owned counts every goroutine the provider starts, and starts none
	// once the provider is closed. Its lock is taken after mu.
	owned lifecycle.Group

	// notifyMu guards notify.
	notifyMu sync.Mutex
	notify   func(*corev1.Pod)

	// mu guards byUID, byKey and orphans.
	mu    sync.Mutex
	byUID map[string]*sandbox
	byKey map[string]string // namespace/name → UID of the newest pod
	// orphans: slots holding pods the provider does not know, since when.
	orphans map[string]time.Time
	// started is when the provider was made or took over (Adopt): the node's start time.
	started time.Time
	// recentReady: create→Ready of recent sandboxes (the capacity page).
	recentReady readyRing

	// statsMu serialises stats collection and guards cpuSeen and
	// cpuRetired: the node's CPU counter is the CPU time of the sandboxes
	// that ended (as last seen) plus that of the running ones (by UID), so
	// it never goes down when a sandbox ends.
	statsMu    sync.Mutex
	cpuSeen    map[string]uint64
	cpuRetired uint64
}

var (
	_ node.PodLifecycleHandler = (*Provider)(nil)
	_ node.PodNotifier         = (*Provider)(nil)
)

// New returns a Provider.
func New(cfg Config) (*Provider, error) {
	switch {
	case cfg.NodeName == "":
		return nil, fmt.Errorf("vk: NodeName is required")
	case cfg.Pool == nil:
		return nil, fmt.Errorf("vk: Pool is required")
	case cfg.Client == nil:
		return nil, fmt.Errorf("vk: Client is required")
	}
	if err := checkPoolLimits(cfg.DefaultLimits, cfg.MaxLimits); err != nil {
		return nil, err
	}
	if err := checkPoolBandwidth(cfg.DefaultBandwidth, cfg.MaxBandwidth); err != nil {
		return nil, err
	}
	if cfg.PidsLimit < 0 {
		return nil, fmt.Errorf("vk: PidsLimit %d is negative", cfg.PidsLimit)
	}
	for _, prof := range cfg.SeccompLocalhostProfiles {
		if !filepath.IsLocal(prof) {
			return nil, fmt.Errorf("vk: seccomp Localhost profile %q: give a path relative to the nodes' seccomp profile directory, without \"..\"", prof)
		}
	}
	if cfg.AllowedNamespaceSelector != nil && cfg.Namespaces == nil {
		return nil, fmt.Errorf("vk: AllowedNamespaceSelector needs Namespaces, a namespace lister, to read the namespaces' labels")
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = 10 * time.Second
	}
	if cfg.KeepPaused <= 0 {
		cfg.KeepPaused = DefaultKeepPaused
	}
	if cfg.OrphanGrace <= 0 {
		cfg.OrphanGrace = 30 * time.Second
	}
	if cfg.StatusWorkers <= 0 {
		cfg.StatusWorkers = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Recorder == nil {
		cfg.Recorder = &record.FakeRecorder{}
	}
	if cfg.DialDaemon == nil {
		cfg.DialDaemon = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	if cfg.UsageInterval == 0 {
		cfg.UsageInterval = 5 * time.Second
	}
	if cfg.UsageRate <= 0 {
		cfg.UsageRate = 500
	}
	if cfg.WaitingStatusQPS == 0 {
		cfg.WaitingStatusQPS = 20
	}
	waitPace := rate.NewLimiter(rate.Inf, 1)
	if qps := cfg.WaitingStatusQPS; qps > 0 {
		waitPace = rate.NewLimiter(rate.Limit(qps), max(1, int(4*qps)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Provider{
		waiting: workqueue.NewTypedRateLimitingQueueWithConfig[string](&workqueue.TypedBucketRateLimiter[string]{Limiter: waitPace},
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "sandman-pod-waiting", Clock: cfg.Clock}),
		cfg: cfg, log: cfg.Logger.With("vnode", cfg.NodeName),
		// Status pushes are deduplicated per pod and never throttled.
		status: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](10*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "sandman-pod-status", Clock: cfg.Clock}),
		ctx: ctx, cancel: cancel,
		daemonHTTP: &http.Client{Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second,
			DialContext: cfg.DialDaemon,
		}},
		byUID:   map[string]*sandbox{},
		byKey:   map[string]string{},
		orphans: map[string]time.Time{},
		cpuSeen: map[string]uint64{},
		started: cfg.Now(),
	}, nil
}

// Close stops the provider's timers (deadlines, resubmissions) and its
// background work (sandbox releases and their retries, status pushes), and
// waits for them. Call it once Run and virtual-kubelet's controllers have
// returned: nothing is started in the background after it. A release it
// cuts short leaves the slot bound; the next run's reconciler releases it.
func (p *Provider) Close() {
	p.owned.Close()
	p.mu.Lock()
	for _, sb := range p.byUID {
		sb.stopTimers()
	}
	p.mu.Unlock()
	p.cancel()
	p.status.ShutDown()
	p.waiting.ShutDown()
	p.owned.Wait()
	p.daemonHTTP.CloseIdleConnections()
}

// afterFuncLocked runs f in an owned goroutine after d on the provider's
// clock; nil once the provider is closed. The caller holds mu and keeps
// the timer in the pod's sandbox, so forgetting the pod or closing the
// provider stops it.
func (p *Provider) afterFuncLocked(d time.Duration, f func()) clock.Timer {
	if p.owned.Closed() {
		return nil
	}
	// A fake clock runs the callback while it holds its own lock: the
	// callback only starts a goroutine, which may read the clock.
	return p.cfg.AfterFunc(d, func() { p.owned.Go(f) })
}

func podKey(ns, name string) string { return ns + "/" + name }

// podRefKey is a node agent's pod reference as namespace/name.
func podRefKey(ref *runtime.PodRef) string {
	if ref == nil {
		return ""
	}
	return podKey(ref.Namespace, ref.Name)
}

// NotifyPods implements node.PodNotifier.
func (p *Provider) NotifyPods(ctx context.Context, cb func(*corev1.Pod)) {
	p.notifyMu.Lock()
	p.notify = cb
	p.notifyMu.Unlock()
	for range p.cfg.StatusWorkers {
		p.owned.Go(func() { p.statusWorker(ctx) })
	}
	// Close shuts the queue down too, whichever comes first.
	context.AfterFunc(ctx, p.status.ShutDown)
	context.AfterFunc(ctx, p.waiting.ShutDown)
	p.owned.Go(p.waitingWorker)
}

func (p *Provider) statusWorker(ctx context.Context) {
	for {
		uid, quit := p.status.Get()
		if quit {
			return
		}
		p.mu.Lock()
		sb := p.byUID[uid]
		var pod *corev1.Pod
		ready := false
		if sb != nil {
			pod, ready = sb.podWithStatus(p.cfg.NodeIP), sb.isReady
		}
		p.mu.Unlock()
		p.notifyMu.Lock()
		cb := p.notify
		p.notifyMu.Unlock()
		if pod != nil && cb != nil && ctx.Err() == nil {
			cb(pod)
			metricStatusUpdates.Inc()
			if ready {
				now := p.cfg.Now()
				p.mu.Lock()
				if sb := p.byUID[uid]; sb != nil {
					p.traceReadyLocked(podKey(pod.Namespace, pod.Name), sb, now)
				}
				p.mu.Unlock()
			}
		}
		p.status.Forget(uid)
		p.status.Done(uid)
	}
}

func (p *Provider) push(uid string) { p.status.Add(uid) }

// waitingWorker tells pods they wait for a slot (status and event), at
// the pace of the waiting lane, unless they no longer wait.
func (p *Provider) waitingWorker() {
	for {
		uid, quit := p.waiting.Get()
		if quit {
			return
		}
		p.mu.Lock()
		sb := p.byUID[uid]
		still := sb != nil && !sb.started() && sb.node == "" && !sb.terminal() && !sb.deleting
		var pod *corev1.Pod
		var reason, message string
		if still {
			pod, reason, message = sb.pod, sb.reason, sb.message
		}
		p.mu.Unlock()
		if still {
			p.push(uid)
			p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, reason, message)
		} else {
			metricWaitingUntold.Inc()
		}
		p.waiting.Done(uid)
	}
}

// boundPushDelay holds back the Running-but-not-ready status of a sandbox
// that was just bound: its daemon usually answers within it, and one
// status write (Ready) replaces two in a burst.
const boundPushDelay = 100 * time.Millisecond

// CreatePod implements node.PodLifecycleHandler: it reserves a place in the
// pool and returns at once; the bind runs asynchronously.
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	// virtual-kubelet hands providers a copy of their own (podForProvider),
	// so the sandbox keeps it without copying again: at 20,000 pods every
	// copy counts.
	uid := string(pod.UID)
	// The pool's access rule comes first: a pod of a namespace it leaves
	// out fails, and never takes a slot or a place in the queue.
	var notAllowed *notAllowedError
	denied := p.namespaceAccess(ctx, pod.Namespace)
	if denied != nil && !errors.As(denied, &notAllowed) {
		return denied // virtual-kubelet retries the create
	}
	p.awaitPullSecrets(ctx, pod)
	p.mu.Lock()
	if sb, ok := p.byUID[uid]; ok {
		sb.pod = pod
		p.mu.Unlock()
		p.push(uid)
		return nil
	}
	sb := newSandbox(pod, p.cfg.Now())
	p.byUID[uid] = sb
	p.byKey[podKey(pod.Namespace, pod.Name)] = uid
	if notAllowed != nil {
		sb.fail(podcontract.ReasonNamespaceNotAllowed, notAllowed.Error(), p.cfg.Now())
		p.mu.Unlock()
		p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonNamespaceNotAllowed, notAllowed.Error())
		p.push(uid)
		return nil
	}
	// A pod that ran before (its status says so) but has no slot now was
	// lost, e.g. while the provider was down: it is not started again —
	// unless it moved, and no node holds it by design.
	moved, isMoved, movedErr := movedFrom(pod)
	if movedErr != nil && lostWhileRunning(pod) {
		p.log.Warn("a pod's moved checkpoint is not its own: it is not restored, and not deleted", "pod", podKey(pod.Namespace, pod.Name), "err", movedErr)
	}
	if lostWhileRunning(pod) && !isMoved && p.cfg.Pool.Unsynced() != nil {
		// Its agent may be one that has not answered yet (slow, not
		// dead): the reconciler adopts it when that agent syncs, or
		// reports it lost once every agent has answered without it or
		// the pool's LostAfter passes.
		sb.awaiting = true
		p.mu.Unlock()
		return nil
	}
	if lostWhileRunning(pod) && !isMoved {
		msg := "the sandbox of this pod no longer exists on any node agent (it was lost while the virtual node was restarting)"
		if movedErr != nil {
			msg += "; " + movedErr.Error()
		}
		sb.fail(podcontract.ReasonSandboxLost, msg, p.cfg.Now())
		p.mu.Unlock()
		p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonSandboxLost, sb.message)
		p.push(uid)
		return nil
	}
	req, err := p.bindRequest(pod)
	if err == nil {
		sb.idleTimeout, err = idleTimeout(pod)
	}
	if err == nil && sb.idleTimeout > 0 && !req.AllowUnauthenticated && p.cfg.ControlKeys == nil {
		err = fmt.Errorf("annotation %s: virtual node %s has no control key, so it holds no token to ask the sandbox how long it has been idle: remove the annotation or give sandman-vk a control key", podcontract.AnnotationIdleTimeout, p.cfg.NodeName)
	}
	if err == nil {
		sb.expiresAt, err = expiresAt(pod)
	}
	if err == nil {
		err = checkExpiryPolicy(pod, req)
	}
	if err == nil {
		req.Fork, err = p.forkSourceLocked(pod)
	}
	if err != nil {
		sb.fail(runtime.ReasonInvalidSpec, err.Error(), p.cfg.Now())
		p.mu.Unlock()
		p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, runtime.ReasonInvalidSpec, err.Error())
		p.push(uid)
		return nil
	}
	sb.req = req
	sb.egressApplied = podcontract.AppliedEgress(pod.Annotations)
	p.armDeadlineLocked(uid, sb)
	p.armExpiryLocked(uid, sb)
	if isMoved && lostWhileRunning(pod) {
		p.restoreMovedLocked(sb, moved)
		// It may have been asked to run meanwhile.
		p.reconcilePauseLocked(uid, sb)
		off := sb.offNode
		p.mu.Unlock()
		p.log.Info("took up a moved sandbox", "pod", podKey(pod.Namespace, pod.Name), "ref", moved.Ref, "paused", off)
		if off {
			p.push(uid)
		} else {
			p.submit(uid)
		}
		return nil
	}
	p.mu.Unlock()
	if f := req.Fork; f != nil {
		p.cfg.Recorder.Eventf(pod, corev1.EventTypeNormal, podcontract.ReasonForking, "a live fork of sandbox %s (fork %s): it starts from a checkpoint of that sandbox's running state",
			pod.Annotations[podcontract.AnnotationForkOf], f.ID)
	}
	p.submit(uid)
	metricPodsCreated.Inc()
	return nil
}

// withControlHashLocked is the sandbox's bind request with the control
// plane's token hash, under the current control key, next to the
// creator's (an unauthenticated sandbox gets none); the sandbox records
// the key. The hash is added at each submission, so a pod that waited
// through a key change binds with the key current then.
func (p *Provider) withControlHashLocked(sb *sandbox) runtime.BindRequest {
	req := sb.req
	if p.cfg.ControlKeys == nil || len(req.TokenHashes) == 0 {
		return req
	}
	key := p.cfg.ControlKeys.Current()
	req.TokenHashes = append(req.TokenHashes[:len(req.TokenHashes):len(req.TokenHashes)], tokenHash(ControlToken(key, string(sb.pod.UID))))
	sb.controlKey = key
	return req
}

// submit hands a pod to the pool; a full queue is retried by the reconciler.
func (p *Provider) submit(uid string) {
	p.mu.Lock()
	sb := p.byUID[uid]
	if sb == nil || sb.terminal() || sb.deleting {
		p.mu.Unlock()
		return
	}
	req := pool.Request{Bind: p.withControlHashLocked(sb), Job: jobOf(sb.pod)}
	sb.submitted = true
	p.mu.Unlock()
	if err := p.cfg.Pool.Submit(req); err != nil && !errdefs.IsAlreadyExists(err) {
		p.mu.Lock()
		sb.submitted = false
		sb.wait(podcontract.ReasonWaitingForSlot, err.Error())
		p.mu.Unlock()
		p.push(uid)
	}
	// Otherwise the pod is Pending as the apiserver made it; the next
	// status says it runs, or why it waits.
}

// UpdatePod implements node.PodLifecycleHandler. A pod of the same name
// with a new UID is a new pod.
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	sb, ok := p.byUID[string(pod.UID)]
	var badExpiry error
	if ok {
		sb.pod = pod // a copy of its own, as in CreatePod
		p.reconcilePauseLocked(string(pod.UID), sb)
		p.reconcileEgressLocked(string(pod.UID), sb)
		// The expiry may move while the pod runs (an E2B timeout set
		// again); an unreadable one keeps the last.
		if at, err := expiresAt(pod); err != nil {
			badExpiry = err
		} else if !at.Equal(sb.expiresAt) && !sb.terminal() && !sb.deleting {
			sb.expiresAt = at
			p.armExpiryLocked(string(pod.UID), sb)
		}
	}
	p.mu.Unlock()
	if !ok {
		return p.CreatePod(ctx, pod)
	}
	if badExpiry != nil {
		p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, runtime.ReasonInvalidSpec, badExpiry.Error()+"; the previous expiry stays")
	}
	p.push(string(pod.UID))
	return nil
}

// DeletePod implements node.PodLifecycleHandler: the sandbox is released in
// the background with the pod's grace period; once it is gone the pod's
// final status is written and the pod object deleted, as a kubelet does.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	uid := string(pod.UID)
	p.mu.Lock()
	sb, ok := p.byUID[uid]
	if !ok {
		p.mu.Unlock()
		return vkerrdefs.NotFoundf("pod %s/%s (%s) is not on virtual node %s", pod.Namespace, pod.Name, uid, p.cfg.NodeName)
	}
	if sb.deleting {
		p.mu.Unlock()
		return nil
	}
	sb.deleting = true
	if pod.DeletionTimestamp != nil {
		// Copies: pod may be the informer's shared object.
		sb.pod.DeletionTimestamp = pod.DeletionTimestamp.DeepCopy()
		if g := pod.DeletionGracePeriodSeconds; g != nil {
			sb.pod.DeletionGracePeriodSeconds = ptr.To(*g)
		}
	}
	grace := 30 * time.Second
	if g := pod.DeletionGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	} else if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Unlock()
	p.owned.Go(func() { p.release(key, uid, grace, true) })
	return nil
}

// DeletionHandler is an event handler for the informer of the node's pods
// (the one virtual-kubelet's pod controller reads) that starts a deleted
// pod's release the moment the informer sees the deletion, as a kubelet
// acts on its own watch. virtual-kubelet's controller calls DeletePod
// too, but through its sync queue, behind every other pod's create and
// update: in a burst that turns slots over, that queue held a deletion
// 1–2 s at the median and 10–17 s at p99 (the oversubscribed-burst bench),
// and the slot with it. DeletePod is idempotent, so whichever call comes
// second finds the release under way.
func (p *Provider) DeletionHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if pod, ok := obj.(*corev1.Pod); ok && pod.DeletionTimestamp != nil {
				p.deleteSeen(pod)
			}
		},
		DeleteFunc: func(obj any) {
			if gone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = gone.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				p.deleteSeen(pod)
			}
		},
	}
}

// deleteSeen starts the release of a pod whose deletion the informer saw.
func (p *Provider) deleteSeen(pod *corev1.Pod) {
	p.mu.Lock()
	sb, ok := p.byUID[string(pod.UID)]
	known := ok && !sb.deleting
	p.mu.Unlock()
	if !known {
		return
	}
	metricDeletesSeen.Inc()
	// DeletePod copies what it keeps of the pod: the informer's copy is
	// shared and stays untouched.
	if err := p.DeletePod(p.ctx, pod); err != nil && !vkerrdefs.IsNotFound(err) {
		p.log.Warn("release of a deleted pod", "pod", podKey(pod.Namespace, pod.Name), "err", err)
	}
}

// release stops a pod's sandbox (key is its namespace/name, for logs) and,
// for a deleted pod, finishes the deletion in the API. Close cuts it short.
func (p *Provider) release(key, uid string, grace time.Duration, deleted bool) {
	ctx := p.ctx
	start := p.cfg.Now()
	backoff := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := p.cfg.Pool.Release(ctx, uid, grace)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return // closing: the next run's reconciler finds the slot
		}
		p.log.Warn("release failed", "pod", key, "uid", uid, "attempt", attempt, "err", err)
		if attempt >= 5 {
			// The reconciler will find the slot as an orphan.
			break
		}
		if !lifecycle.Sleep(ctx, p.cfg.Clock, backoff) {
			return
		}
		backoff *= 2
	}
	p.dropMoved(uid)
	metricReleases.WithLabelValues(map[bool]string{true: "deleted", false: "ended"}[deleted]).Inc()
	if deleted {
		metricReleaseSeconds.Observe(p.cfg.Now().Sub(start).Seconds())
	}
	if !deleted {
		return
	}
	p.mu.Lock()
	sb := p.byUID[uid]
	var pod *corev1.Pod
	if sb != nil {
		sb.released(p.cfg.Now())
		pod = sb.pod
	}
	p.mu.Unlock()
	if pod == nil {
		return
	}
	// A pod deleted at once (grace 0, or forced) is gone from the API
	// already: its deletion needs no finishing, and asking again costs the
	// apiserver a read of etcd for a 404 (one per turnover in a burst).
	// The informer may still hold it: the apiserver writes the deletion
	// timestamp (grace 0) and removes the pod in the same request, and the
	// release starts on the first of the two events.
	if removedAtOnce(pod) {
		p.forget(uid)
		return
	}
	if p.cfg.Pods != nil {
		if cur, err := p.cfg.Pods.Pods(pod.Namespace).Get(pod.Name); apierrors.IsNotFound(err) || err == nil && cur.UID != pod.UID {
			p.forget(uid)
			return
		}
	}
	err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.log.Warn("delete released pod", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		return // the reconciler and virtual-kubelet's own delete retry
	}
	p.forget(uid)
}

// forget drops a pod the provider is done with.
func (p *Provider) forget(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sb, ok := p.byUID[uid]
	if !ok {
		return
	}
	sb.stopTimers()
	delete(p.byUID, uid)
	key := podKey(sb.pod.Namespace, sb.pod.Name)
	if p.byKey[key] == uid {
		delete(p.byKey, key)
	}
}

// GetPod implements node.PodLifecycleHandler. Pods still waiting or binding
// are included, so virtual-kubelet calls DeletePod for them.
func (p *Provider) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sb := p.byUID[p.byKey[podKey(namespace, name)]]
	if sb == nil {
		return nil, vkerrdefs.NotFoundf("pod %s/%s is not on virtual node %s", namespace, name, p.cfg.NodeName)
	}
	return sb.podWithStatus(p.cfg.NodeIP), nil
}

// GetPodStatus implements node.PodLifecycleHandler.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods implements node.PodLifecycleHandler.
func (p *Provider) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.byUID))
	for _, sb := range p.byUID {
		out = append(out, sb.podWithStatus(p.cfg.NodeIP))
	}
	return out, nil
}

// OnUpdate takes the pool's placement updates (pool.Config.OnUpdate).
func (p *Provider) OnUpdate(u pool.Update) {
	p.mu.Lock()
	sb := p.byUID[u.UID]
	if sb == nil || sb.terminal() {
		p.mu.Unlock()
		return
	}
	var event func()
	var resubmitAfter, pushAfter time.Duration
	var releaseNow bool
	key := podKey(sb.pod.Namespace, sb.pod.Name)
	switch u.Kind {
	case pool.Queued:
		// Said when the waiting lane gets to it, if the pod still waits:
		// in a burst most of these would only delay the Ready statuses
		// of the pods that got slots.
		sb.wait(u.Reason, u.Message)
		p.mu.Unlock()
		p.waiting.AddRateLimited(u.UID)
		return
	case pool.Placing:
		sb.placing(u.Node)
		sb.trace.placed = u.Time
		p.mu.Unlock()
		return // nothing a status shows yet
	case pool.Moved:
		p.movedLocked(sb, u)
		if !sb.offNode {
			resubmitAfter = time.Millisecond
		}
		pod, m := sb.pod, *u.Moved
		event = func() {
			reason := podcontract.ReasonMoving
			if m.Paused {
				reason = podcontract.ReasonMoved
			}
			p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, reason, u.Message)
		}
	case pool.Bound:
		// A moved sandbox's checkpoint is used up once it runs again.
		if sb.req.Restore != nil {
			sb.req.Restore = nil
			pod := sb.pod
			p.owned.Go(func() { p.recordMoved(pod, nil) })
		}
		sb.bound(u.Node, u.Slot, u.Time)
		sb.trace.bound = u.Time
		if !sb.isReady {
			pushAfter = boundPushDelay
		}
		if sb.moves == 0 {
			metricCreateToBound.Observe(u.Time.Sub(sb.created).Seconds())
		}
	case pool.Ready:
		if sb.trace.readyOnNode.IsZero() {
			sb.trace.readyOnNode, sb.trace.readySeen = u.Time, p.cfg.Now()
		}
		if sb.moving {
			sb.moving, sb.message = false, ""
			pod, msg := sb.pod, fmt.Sprintf("the sandbox runs on node %s from where it stopped (address %s)", u.Node, u.Slot.IP)
			event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, podcontract.ReasonMoved, msg) }
		}
		if sb.ready(u.Node, u.Slot, u.Time) && sb.pauses == 0 && sb.moves == 0 {
			metricCreateToReady.Observe(u.Time.Sub(sb.created).Seconds())
			p.recentReady.add(u.Time, u.Time.Sub(sb.created))
		}
		p.reconcilePauseLocked(u.UID, sb) // a pause waits for Ready
	case pool.Exited:
		if sb.exited(u.Container, u.ExitCode, u.Reason, u.Message, u.Time) {
			releaseNow = true
		}
		if u.Reason == runtime.ReasonEvicted {
			// The node stopped the whole sandbox (its disk limit, a drain):
			// the pod says why, as a kubelet's evicted pod does.
			sb.fail(u.Reason, u.Message, u.Time)
			releaseNow = true
			pod := sb.pod
			event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, u.Reason, u.Message) }
		}
	case pool.Failed:
		metricBindFailures.WithLabelValues(u.Reason).Inc()
		pod := sb.pod
		switch {
		case u.Permanent:
			sb.fail(u.Reason, u.Message, u.Time)
		case u.Reason == runtime.ReasonErrImagePull || u.Reason == runtime.ReasonImageNotFound:
			resubmitAfter = sb.imageBackoff(u.Message, u.Time)
		default:
			resubmitAfter = sb.retryBackoff(u.Reason, u.Message)
		}
		event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, u.Reason, u.Message) }
	case pool.Lost:
		pod := sb.pod
		if sb.started() {
			sb.fail(u.Reason, u.Message, u.Time)
		} else {
			resubmitAfter = time.Millisecond
			sb.wait(podcontract.ReasonWaitingForSlot, u.Message)
		}
		event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, u.Reason, u.Message) }
	}
	if resubmitAfter > 0 {
		sb.submitted = false
		uid := u.UID
		stopTimer(sb.resubmit)
		sb.resubmit = p.afterFuncLocked(resubmitAfter, func() { p.submit(uid) })
	}
	p.mu.Unlock()
	if pushAfter > 0 {
		p.status.AddAfter(u.UID, pushAfter)
	} else {
		p.push(u.UID)
	}
	if event != nil {
		event()
	}
	if releaseNow {
		p.owned.Go(func() { p.release(key, u.UID, 0, false) })
	}
}

// bindRequest turns a pod into what a node agent needs.
func (p *Provider) bindRequest(pod *corev1.Pod) (runtime.BindRequest, error) {
	req := runtime.BindRequest{
		Pod:         runtime.PodRef{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name},
		Hostname:    pod.Spec.Hostname,
		VirtualNode: p.cfg.NodeName,
		// The daemon restarts a main command in place, as a kubelet restarts
		// a container; the deadline still applies.
		RestartPolicy: string(pod.Spec.RestartPolicy),
		// false: a user namespace; the node agent's --user-namespaces
		// decides when the pod does not say, and may refuse true.
		HostUsers: pod.Spec.HostUsers,
	}
	if len(pod.Spec.InitContainers) > 0 {
		return req, fmt.Errorf("pod %s/%s has init containers, which sandboxes do not run: remove them", pod.Namespace, pod.Name)
	}
	if err := podSecurity(pod); err != nil {
		return req, err
	}
	if err := p.hostUsers(pod); err != nil {
		return req, err
	}
	handler, err := p.runtimeHandler(pod)
	if err != nil {
		return req, err
	}
	req.RuntimeHandler = handler
	for _, c := range pod.Spec.Containers {
		cs, err := containerSpec(pod, c)
		if err != nil {
			return req, err
		}
		if err := p.seccompLocalhost(pod, c, cs.SeccompLocalhost); err != nil {
			return req, err
		}
		if err := p.privilegeEscalation(pod, c, cs.AllowPrivilegeEscalation); err != nil {
			return req, err
		}
		if err := p.poolLimits(c, &cs); err != nil {
			return req, err
		}
		req.Containers = append(req.Containers, cs)
	}
	if v := pod.Annotations[podcontract.AnnotationTokenSHA256]; v != "" {
		for h := range strings.SplitSeq(v, ",") {
			h = strings.ToLower(strings.TrimSpace(h))
			if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
				return req, fmt.Errorf("annotation %s: %q is not a hex SHA-256 (64 hex digits): give sha256(token) of the token you will send", podcontract.AnnotationTokenSHA256, h)
			}
			req.TokenHashes = append(req.TokenHashes, h)
		}
	}
	if err := p.poolBandwidth(pod, &req); err != nil {
		return req, err
	}
	e, err := egressOf(pod)
	if err != nil {
		return req, err
	}
	req.Egress, req.EgressDeny, req.EgressDomains = e.Egress, e.EgressDeny, e.EgressDomains
	if v, ok := pod.Annotations[podcontract.AnnotationControlPorts]; ok {
		ports, err := sandboxnet.ParsePorts(v)
		if err == nil && len(ports) == 0 {
			err = errors.New("it lists nothing")
		}
		if err != nil {
			return req, fmt.Errorf("annotation %s: %v: give the TCP ports the control plane may reach, such as 8000,1024-65535, or remove it", podcontract.AnnotationControlPorts, err)
		}
		for _, p := range ports {
			r := fmt.Sprint(p.Port)
			if p.EndPort > p.Port {
				r = fmt.Sprintf("%d-%d", p.Port, p.EndPort)
			}
			req.ControlPorts = append(req.ControlPorts, r)
		}
	}
	if len(req.TokenHashes) == 0 {
		if !p.cfg.AllowUnauthenticated {
			return req, fmt.Errorf("pod %s/%s has no %s annotation and pool %s does not allow unauthenticated sandboxes: add the annotation with the hex SHA-256 of a token you keep", pod.Namespace, pod.Name, podcontract.AnnotationTokenSHA256, p.cfg.NodeName)
		}
		req.AllowUnauthenticated = true
	}
	for _, ref := range pod.Spec.ImagePullSecrets {
		if p.cfg.Secrets == nil {
			break
		}
		s, err := p.cfg.Secrets.Secrets(pod.Namespace).Get(ref.Name)
		if err != nil {
			p.log.Warn("image pull secret not found", "pod", podKey(pod.Namespace, pod.Name), "secret", ref.Name, "err", err)
			continue
		}
		if b, ok := s.Data[corev1.DockerConfigJsonKey]; ok {
			req.PullSecrets = append(req.PullSecrets, b)
		}
	}
	return req, req.Validate()
}

// jobOf names the trainer job of a pod: its sandman.io/job label, else its
// controller owner, else its namespace.
func jobOf(pod *corev1.Pod) string {
	if j := pod.Labels[podcontract.LabelJob]; j != "" {
		return pod.Namespace + "/" + j
	}
	if o := metav1.GetControllerOf(pod); o != nil {
		return pod.Namespace + "/" + o.Kind + "/" + o.Name
	}
	for _, o := range pod.OwnerReferences {
		return pod.Namespace + "/" + o.Kind + "/" + o.Name
	}
	return pod.Namespace
}

// lostWhileRunning: the pod's status says it ran (set by an earlier run of
// the provider), yet the provider does not hold it.
func lostWhileRunning(pod *corev1.Pod) bool {
	if pod.Status.Phase == corev1.PodRunning {
		return true
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// trimPod drops what the virtual node never reads from pods it caches
// (managedFields), for the pod informer's SetTransform.
func trimPod(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		pod.ManagedFields = nil
	}
	return obj, nil
}

// egressOf is what the pod's egress annotations (AnnotationEgress,
// AnnotationEgressDeny, AnnotationEgressDomains) let its sandbox reach.
func egressOf(pod *corev1.Pod) (runtime.Egress, error) {
	var req runtime.Egress
	if v, ok := pod.Annotations[podcontract.AnnotationEgress]; ok {
		if strings.EqualFold(strings.TrimSpace(v), podcontract.EgressNone) {
			// Everything denied by the pod itself, which wins over the
			// pool's exceptions; it narrows, so any pool takes it.
			req.EgressDeny = append(req.EgressDeny, "0.0.0.0/0")
		} else {
			prefixes, err := sandboxnet.ParsePrefixes(v)
			if err == nil && len(prefixes) == 0 {
				err = errors.New("it lists nothing")
			}
			if err != nil {
				return req, fmt.Errorf("annotation %s: %v: give the IPv4 CIDRs the sandbox may reach, or %s alone for no egress at all", podcontract.AnnotationEgress, err, podcontract.EgressNone)
			}
			for _, p := range prefixes {
				req.Egress = append(req.Egress, p.String())
			}
		}
	}
	if v, ok := pod.Annotations[podcontract.AnnotationEgressDeny]; ok {
		prefixes, err := sandboxnet.ParsePrefixes(v)
		if err == nil && len(prefixes) == 0 {
			err = errors.New("it lists nothing")
		}
		if err != nil {
			return req, fmt.Errorf("annotation %s: %v: give the IPv4 CIDRs the sandbox may never reach, or remove it", podcontract.AnnotationEgressDeny, err)
		}
		for _, p := range prefixes {
			req.EgressDeny = append(req.EgressDeny, p.String())
		}
	}
	if v, ok := pod.Annotations[podcontract.AnnotationEgressDomains]; ok {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), "."); name != "" {
				req.EgressDomains = append(req.EgressDomains, name)
			}
		}
		err := runtime.CheckEgressDomains(req.EgressDomains)
		if err == nil && len(req.EgressDomains) == 0 {
			err = errors.New("it lists nothing")
		}
		if err != nil {
			return req, fmt.Errorf("annotation %s: %v: give the DNS names the sandbox may reach, such as api.example.com,*.pypi.org", podcontract.AnnotationEgressDomains, err)
		}
	}
	return req, nil
}
