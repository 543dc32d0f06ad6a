package vk

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// sandbox is the provider's record of one pod: what it asked for and where
// its sandbox is in its life. The provider's mutex guards it.
type sandbox struct {
	pod     *corev1.Pod
	req     runtime.BindRequest
	created time.Time
	// trace: when the pod passed each stage on its way to Ready
	// (metricStage, and a debug log line once its Ready status is handed
	// over).
	trace     podTrace
	submitted bool
	deleting  bool
	// awaiting: the pod ran before this provider started and no synced
	// node agent holds it yet; one that has not answered may (Adopt and
	// the reconciler settle it).
	awaiting bool

	// Pause (pause.go): paused, the sandbox is checkpointed on its node;
	// pauseOp is the pause or resume under way (ReasonPausing,
	// ReasonResuming); pauseMessage and pauseSince describe the last
	// change; pauseRefused, a failed pause not tried again until the pod
	// asks to run; pauses counts the pauses.
	paused       bool
	pauseOp      string
	pauseMessage string
	pauseSince   time.Time
	pauseRefused bool
	pauses       int
	// Moves (a drain's: pool.Moved): moving, the sandbox is being restored
	// on another node from req.Restore; offNode, it moved while paused and
	// no node holds it (its resume is a bind of req.Restore); moves counts
	// them.
	moving, offNode bool
	moves           int
	// moveAsked: MovePausedAfter asked its node to move it (once per
	// pause).
	moveAsked bool
	// egressApplied is the digest (podcontract.EgressDigest) of the egress
	// its sandbox has; egressRefused that of annotations not to try again;
	// egressOp: a change is under way.
	egressApplied, egressRefused string
	egressOp                     bool
	// pausingAtExpiry is the expiry at which the provider asked for the
	// sandbox to be paused (AnnotationOnExpiry), until the pod says so.
	pausingAtExpiry time.Time
	// Waiting: reason and message for the containers (and the pod when
	// failed).
	reason, message string
	// snapshots is the podcontract.AnnotationSnapshots value this provider wrote
	// last (recordSnapshot). Every pod handed over with a status carries
	// it: virtual-kubelet writes statuses through pods/status, which
	// writes the pod's annotations too, and a pod copied before the
	// snapshot was recorded would drop it.
	snapshots string
	// Placement.
	node      string
	slot      runtime.Slot
	startedAt time.Time
	readyAt   time.Time
	isReady   bool
	// exits by container name.
	exits map[string]exit
	// failed: terminal with reason/message; releasedAt: deleted and gone.
	failed     bool
	failedAt   time.Time
	releasedAt time.Time
	// Image pull failures so far (for the back-off); other failures.
	pullFailures, failures int
	// idleTimeout from the pod's annotation; nextIdleCheck is when its
	// daemon is asked next.
	idleTimeout   time.Duration
	nextIdleCheck time.Time
	// deadline fires at the pod's active deadline, resubmit after a
	// failed bind's back-off; both stop when the provider forgets the pod
	// or closes.
	deadline, resubmit clock.Timer
	// expiresAt from the pod's sandman.io/expires-at annotation (zero when
	// it has none); expiry fires then.
	expiresAt time.Time
	expiry    clock.Timer
	// controlKey is the control key whose token every daemon of the
	// sandbox is known to accept (nil: not known, as after an adoption);
	// rekeyFailed says a re-key to the current key failed already (its
	// next failures are logged quietly).
	controlKey  []byte
	rekeyFailed bool
	// usage: its resource use over its life (usage.go), from its first
	// reading.
	usage *usageRing
}

func (s *sandbox) stopTimers() {
	stopTimer(s.deadline)
	stopTimer(s.resubmit)
	stopTimer(s.expiry)
	s.deadline, s.resubmit, s.expiry = nil, nil, nil
}

func stopTimer(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

type exit struct {
	code            int
	reason, message string
	at              time.Time
}

func newSandbox(pod *corev1.Pod, now time.Time) *sandbox {
	return &sandbox{pod: pod, created: now, reason: "ContainerCreating", exits: map[string]exit{}}
}

func (s *sandbox) started() bool { return !s.startedAt.IsZero() }

// terminal: no more changes but deletion.
func (s *sandbox) terminal() bool {
	return s.failed || !s.releasedAt.IsZero() || s.allExited()
}

func (s *sandbox) allExited() bool {
	return len(s.pod.Spec.Containers) > 0 && len(s.exits) >= len(s.pod.Spec.Containers)
}

func (s *sandbox) wait(reason, message string) {
	if !s.started() {
		s.reason, s.message = reason, message
	}
}

func (s *sandbox) placing(node string) {
	s.node = node
	if !s.started() && s.pullFailures == 0 {
		s.reason, s.message = "ContainerCreating", ""
	}
}

func (s *sandbox) bound(node string, slot runtime.Slot, at time.Time) {
	s.node, s.slot = node, slot.Clone()
	if s.startedAt.IsZero() {
		s.startedAt = at
	}
	s.reason, s.message = "", ""
	s.pullFailures, s.failures = 0, 0
}

// ready marks the sandbox ready; true the first time.
func (s *sandbox) ready(node string, slot runtime.Slot, at time.Time) bool {
	if s.slot.ID == "" {
		s.bound(node, slot, at)
	}
	if s.isReady {
		return false
	}
	s.isReady, s.readyAt = true, at
	return true
}

// exited records a container's exit; true when the sandbox has ended.
func (s *sandbox) exited(container string, code int, reason, message string, at time.Time) bool {
	if reason == "" {
		reason = runtime.ReasonCompleted
		if code != 0 {
			reason = runtime.ReasonError
		}
	}
	s.exits[container] = exit{code: code, reason: reason, message: message, at: at}
	s.isReady = false
	return s.allExited()
}

func (s *sandbox) fail(reason, message string, at time.Time) {
	s.failed, s.failedAt, s.reason, s.message = true, at, reason, message
}

func (s *sandbox) released(at time.Time) { s.releasedAt = at }

// imageBackoff records an image pull failure and returns when to try again:
// 5 s doubling to 5 min, as ErrImagePull then ImagePullBackOff.
func (s *sandbox) imageBackoff(message string, now time.Time) time.Duration {
	s.pullFailures++
	s.reason, s.message = runtime.ReasonErrImagePull, message
	if s.pullFailures > 1 {
		s.reason = "ImagePullBackOff"
		s.message = "Back-off pulling image: " + message
	}
	return backoff(5*time.Second, 5*time.Minute, s.pullFailures)
}

// retryBackoff records another failure that retrying may fix.
func (s *sandbox) retryBackoff(reason, message string) time.Duration {
	s.failures++
	s.reason, s.message = reason, message
	return backoff(time.Second, time.Minute, s.failures)
}

func backoff(base, ceiling time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// phase is the pod phase a kubelet would report.
func (s *sandbox) phase() corev1.PodPhase {
	switch {
	case s.failed:
		return corev1.PodFailed
	case !s.releasedAt.IsZero() || s.allExited():
		for _, e := range s.exits {
			if e.code != 0 {
				return corev1.PodFailed
			}
		}
		return corev1.PodSucceeded
	case s.started():
		return corev1.PodRunning
	}
	return corev1.PodPending
}

// podWithStatus is the pod with the status a kubelet would report.
func (s *sandbox) podWithStatus(nodeIP string) *corev1.Pod {
	pod := s.pod.DeepCopy()
	if s.snapshots != "" {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[podcontract.AnnotationSnapshots] = s.snapshots
	}
	if s.awaiting {
		// Not known yet: the status stays what the last provider wrote.
		return pod
	}
	old := s.pod.Status
	st := corev1.PodStatus{QOSClass: old.QOSClass}
	if st.QOSClass == "" {
		st.QOSClass = qosClass(pod)
	}
	created := metav1.NewTime(s.created.Truncate(time.Second))
	if !pod.CreationTimestamp.IsZero() {
		created = pod.CreationTimestamp
	}
	st.StartTime = &created
	if nodeIP != "" {
		st.HostIP = nodeIP
		st.HostIPs = []corev1.HostIP{{IP: nodeIP}}
	}
	if s.slot.IP != "" && s.started() {
		st.PodIP = s.slot.IP
		st.PodIPs = []corev1.PodIP{{IP: s.slot.IP}}
	}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, s.containerStatus(c))
	}
	ready := s.isReady && !s.terminal()
	st.Phase = s.phase()
	if s.failed {
		st.Reason, st.Message = s.reason, s.message
	} else if s.paused && !s.terminal() {
		st.Reason, st.Message = podcontract.ReasonPaused, s.pauseMessage
	} else if s.moving && !s.terminal() {
		st.Reason, st.Message = podcontract.ReasonMoving, s.message
	}
	scheduled := created
	readyAt := scheduled
	if ready {
		readyAt = metav1.NewTime(s.readyAt.Truncate(time.Second))
	} else if s.started() {
		readyAt = metav1.NewTime(s.startedAt.Truncate(time.Second))
	}
	cond := func(t corev1.PodConditionType, ok bool, at metav1.Time, reason string) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: at}
		if ok {
			c.Status = corev1.ConditionTrue
		} else {
			c.Reason = reason
		}
		return c
	}
	notReady := "ContainersNotReady"
	if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
		notReady = "PodCompleted"
	}
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, s.started(), readyAt, ""),
		cond(corev1.PodInitialized, true, scheduled, ""),
		cond(corev1.PodReady, ready, readyAt, notReady),
		cond(corev1.ContainersReady, ready, readyAt, notReady),
		cond(corev1.PodScheduled, true, scheduled, ""),
	}
	if c, ok := s.pauseCondition(); ok {
		st.Conditions = append(st.Conditions, c)
	}
	pod.Status = st
	return pod
}

func (s *sandbox) containerStatus(c corev1.Container) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "", RestartCount: 0}
	if s.slot.ID != "" {
		cs.ContainerID = "containerd://" + s.slot.ID + "-" + c.Name
	}
	started := metav1.NewTime(s.startedAt.Truncate(time.Second))
	switch e, ok := s.exits[c.Name]; {
	case ok:
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: int32(e.code), Reason: e.reason, Message: e.message,
			StartedAt: started, FinishedAt: metav1.NewTime(e.at.Truncate(time.Second)), ContainerID: cs.ContainerID}
	case s.started() && !s.releasedAt.IsZero():
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0, Reason: podcontract.ReasonReleased,
			Message: "the sandbox was released because its pod was deleted", StartedAt: started,
			FinishedAt: metav1.NewTime(s.releasedAt.Truncate(time.Second)), ContainerID: cs.ContainerID}
	case s.started() && !s.failed:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: started}
		cs.Ready = s.isReady
		t := true
		cs.Started = &t
	case s.started() && s.failed:
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 137, Reason: s.reason, Message: s.message,
			StartedAt: started, FinishedAt: metav1.NewTime(s.failedAt.Truncate(time.Second)), ContainerID: cs.ContainerID}
	default:
		reason := s.reason
		if reason == "" {
			reason = "ContainerCreating"
		}
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: s.message}
	}
	f := false
	if cs.Started == nil {
		cs.Started = &f
	}
	return cs
}

// containerSpec turns a pod container into a runtime one.
func containerSpec(pod *corev1.Pod, c corev1.Container) (runtime.ContainerSpec, error) {
	cs := runtime.ContainerSpec{Name: c.Name, Image: c.Image, Command: c.Command, Args: c.Args, WorkingDir: c.WorkingDir}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.Value == "" {
			continue // not resolved (virtual-kubelet resolves what it can)
		}
		cs.Env = append(cs.Env, e.Name+"="+e.Value)
	}
	if err := containerSecurity(pod, c, &cs); err != nil {
		return cs, err
	}
	// The apiserver admits quantities too large for an int64, which
	// MilliValue and Value would wrap (1e30 cores reads as none).
	for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		for _, r := range []struct {
			name  corev1.ResourceName
			scale float64
		}{{corev1.ResourceCPU, 1000}, {corev1.ResourceMemory, 1}, {corev1.ResourceEphemeralStorage, 1}} {
			if q, ok := l[r.name]; ok && (q.Sign() < 0 || q.AsApproximateFloat64()*r.scale >= 1<<62) {
				return cs, fmt.Errorf("container %q: %s quantity %s is out of range: give a non-negative amount a node can have", c.Name, r.name, q.String())
			}
		}
	}
	res := func(l corev1.ResourceList) runtime.Resources {
		var r runtime.Resources
		if q, ok := l[corev1.ResourceCPU]; ok {
			r.MilliCPU = q.MilliValue()
		}
		if q, ok := l[corev1.ResourceMemory]; ok {
			r.MemoryBytes = q.Value()
		}
		return r
	}
	cs.Requests, cs.Limits = res(c.Resources.Requests), res(c.Resources.Limits)
	// Requests default to limits, as the apiserver does for pods it admits.
	if cs.Requests.MilliCPU == 0 {
		cs.Requests.MilliCPU = cs.Limits.MilliCPU
	}
	if cs.Requests.MemoryBytes == 0 {
		cs.Requests.MemoryBytes = cs.Limits.MemoryBytes
	}
	if q, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
		cs.DiskBytes = q.Value()
	}
	// Guaranteed QoS with whole cores: exclusive cores.
	if qosClass(pod) == corev1.PodQOSGuaranteed {
		if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && q.MilliValue()%1000 == 0 {
			cs.ExclusiveCPUs = int(q.Value())
		}
	}
	if c.Image == "" {
		return cs, fmt.Errorf("container %q has no image", c.Name)
	}
	for _, port := range c.Ports {
		switch port.Protocol {
		case "", corev1.ProtocolTCP, corev1.ProtocolUDP:
		default:
			return cs, fmt.Errorf("container %q port %d: protocol %s is not supported by sandboxes: use TCP or UDP", c.Name, port.ContainerPort, port.Protocol)
		}
		if port.HostPort != 0 || port.HostIP != "" {
			return cs, fmt.Errorf("container %q port %d: hostPort/hostIP cannot be honoured on a virtual node (a sandbox has its own address): remove them", c.Name, port.ContainerPort)
		}
		cs.Ports = append(cs.Ports, runtime.Port{Port: port.ContainerPort, Protocol: string(port.Protocol)})
	}
	return cs, nil
}

// qosClass follows Kubernetes: Guaranteed when every container has CPU and
// memory limits equal to its requests, BestEffort when none has any, else
// Burstable.
func qosClass(pod *corev1.Pod) corev1.PodQOSClass {
	any, guaranteed := false, true
	for _, c := range pod.Spec.Containers {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			l, hasL := c.Resources.Limits[name]
			r, hasR := c.Resources.Requests[name]
			if hasL || hasR {
				any = true
			}
			if !hasL || (hasR && r.Cmp(l) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case !any:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	default:
		return corev1.PodQOSBurstable
	}
}
