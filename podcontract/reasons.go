package podcontract

// Reasons the virtual node gives a sandbox pod: its status's reason (a
// failed pod's, or a pending one's PodScheduled condition), its container's
// waiting or terminated reason, and the reason of the events it records.
const (
	// ReasonWaitingForSlot: the pod waits in the pool's fair admission
	// queue for a slot (Normal event; pending pod).
	ReasonWaitingForSlot = "WaitingForSlot"
	// ReasonNamespaceNotAllowed fails a pod whose namespace may not use
	// the pool (sandman-vk --allowed-namespace, --allowed-namespace-selector).
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	// ReasonDeadlineExceeded is kubelet's reason for a pod past its
	// spec.activeDeadlineSeconds.
	ReasonDeadlineExceeded = "DeadlineExceeded"
	// ReasonExpired is the event reason of a reclaim at AnnotationExpiresAt.
	ReasonExpired = "Expired"
	// ReasonIdleTimeout is the event reason of a reclaim after
	// AnnotationIdleTimeout.
	ReasonIdleTimeout = "IdleTimeout"
	// ReasonSnapshotted is the Normal event recorded on a pod after a
	// snapshot of it.
	ReasonSnapshotted = "Snapshotted"
	// ReasonSandboxLost fails a started pod whose sandbox no node agent
	// has any more.
	ReasonSandboxLost = "SandboxLost"
	// ReasonNodeLost fails a started pod whose node agent stopped
	// answering.
	ReasonNodeLost = "NodeLost"
	// ReasonEgressChanged and ReasonEgressFailed are the events of a
	// change of a running sandbox's egress annotations: applied, or
	// refused by its node (the previous egress stays).
	ReasonEgressChanged = "EgressChanged"
	ReasonEgressFailed  = "EgressFailed"
	// ReasonReleased terminates the container of a sandbox released
	// because its pod was deleted.
	ReasonReleased = "Released"
)

// A paused sandbox (AnnotationPause): its pod's ConditionPaused, with one
// of these reasons, and events of the same reasons. While it is paused the
// pod is Running and not Ready, and its status's reason is ReasonPaused
// (kubectl's STATUS column).
const (
	// ConditionPaused is True while the sandbox is paused (or resuming),
	// False once it runs again (or while it is being paused).
	ConditionPaused = "sandman.io/Paused"
	// ReasonPausing: the checkpoint is being written.
	ReasonPausing = "Pausing"
	// ReasonPaused: the sandbox is checkpointed and stopped (Normal
	// event, with the checkpoint's size).
	ReasonPaused = "Paused"
	// ReasonResuming: the sandbox is being restored.
	ReasonResuming = "Resuming"
	// ReasonResumed: the sandbox runs again where it stopped (Normal
	// event).
	ReasonResumed = "Resumed"
	// ReasonPauseFailed: the pause failed and the sandbox runs on
	// (Warning event, saying why; for example a runc sandbox, which
	// cannot keep its processes).
	ReasonPauseFailed = "PauseFailed"
	// ReasonResumeFailed: the resume failed (Warning event). A sandbox
	// whose checkpoint cannot be restored fails with this reason; one
	// that waits for room stays paused and is tried again.
	ReasonResumeFailed = "ResumeFailed"
	// ReasonForking: the pod is a live fork (AnnotationForkOf) and starts
	// from a checkpoint of its source (Normal event, naming the source).
	// A fork that cannot start fails with StartError saying why.
	ReasonForking = "Forking"
	// ReasonMoving: a drain of its worker checkpointed the sandbox and it
	// is being restored on another worker (Normal event, naming the
	// checkpoint; the pod's status reason meanwhile). Its address changes;
	// connections open before the move are reset.
	ReasonMoving = "Moving"
	// ReasonMoved: the sandbox runs on another worker from where it
	// stopped, or, paused when it moved, waits off any worker until it is
	// resumed (Normal event).
	ReasonMoved = "Moved"
)

// A virtual node's own condition types and their reasons, beside the
// kubelet's standard ones.
const (
	// ConditionNodeAgentsReady says whether any node agent of the pool is
	// reachable: ReasonNodeAgentsReachable or ReasonNoNodeAgents.
	ConditionNodeAgentsReady  = "NodeAgentsReady"
	ReasonNodeAgentsReachable = "NodeAgentsReachable"
	ReasonNoNodeAgents        = "NoNodeAgents"
	// ConditionQueueRoom says in words what the advertised capacity
	// includes (ReasonQueueRoomAdvertised): AnnotationQueueRoom pods
	// beyond the slots.
	ConditionQueueRoom        = "SandmanQueueRoom"
	ReasonQueueRoomAdvertised = "QueueRoomAdvertised"
)
