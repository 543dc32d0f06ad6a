package noderuntime

// Labels on every container sandman makes; recovery reads them back.
const (
	LabelNode         = "sandman.io/node"
	LabelSlot         = "sandman.io/slot"
	LabelPodUID       = "sandman.io/pod-uid"
	LabelPodNamespace = "sandman.io/pod-namespace"
	LabelPodName      = "sandman.io/pod-name"
	LabelVirtualNode  = "sandman.io/virtual-node"
	LabelContainer    = "sandman.io/container"
	LabelIndex        = "sandman.io/container-index"
	LabelImage        = "sandman.io/image"
	LabelHot          = "sandman.io/hot"
)

// LabelRequests keeps the pod's summed requests ("milliCPU,bytes") so a
// restarted agent accounts for them.
const LabelRequests = "sandman.io/requests"

// LabelExclusiveCPUs records a container's exclusive cores for recovery.
const LabelExclusiveCPUs = "sandman.io/exclusive-cpus"

// LabelUserNS is the host uid of a sandbox's user namespace (its slot's
// range), so a restarted agent keeps the range taken.
const LabelUserNS = "sandman.io/userns-base"

// LabelRuntimeHandler marks the containers gVisor runs (runsc).
const LabelRuntimeHandler = "sandman.io/runtime-handler"

// Labels of a holder (beside LabelNode): LabelHolder "true" and the group it
// holds.
const (
	LabelHolder    = "sandman.io/holder"
	LabelShimGroup = "sandman.io/shim-group"
)

// DaemonMountPath is where the daemon binary appears in every sandbox.
const DaemonMountPath = "/.sandman/sandman-daemon"

// DaemonStateDir is the daemon's own tmpfs in every sandbox (its
// --state-dir): a read-only root filesystem leaves it somewhere to write.
const DaemonStateDir = "/.sandman/state"
