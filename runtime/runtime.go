package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/distribution/reference"
)

// ErrImagePull marks a bind that failed because an image could not be
// pulled (missing, refused, registry unreachable); the error's message is
// the registry's. The virtual node reports it as ErrImagePull, then
// ImagePullBackOff, and retries with backoff.
var ErrImagePull = errors.New("image pull failed")

// ErrNotServing marks the answer of a node agent that runs but does not
// serve yet (starting, or waiting for containerd): unlike one that cannot
// be reached, it is about to serve, and the pool asks again within a
// second rather than backing off further. It is also ErrUnavailable.
var ErrNotServing = errors.New("node agent not serving yet")

// Runtime is a node's set of sandbox slots. Slots move
// warm → binding → bound → releasing → warm, or to broken when a slot cannot
// be recycled. Implementations: runtime/noderuntime (real) and runtime/fake.
//
// Errors use github.com/containerd/errdefs classes:
//   - ErrResourceExhausted: no warm slot, or the pod does not fit;
//   - ErrInvalidArgument: a request that can never succeed (bad resources,
//     no containers) — fix the pod;
//   - ErrNotFound: an unknown pod UID, or a missing image (with ImageError
//     telling which);
//   - ErrAlreadyExists: the pod is bound already;
//   - ErrUnavailable: the runtime cannot reach its backend right now.
type Runtime interface {
	// Bind puts the pod into a warm slot and starts it. It returns once the
	// sandbox's containers are started (state bound); readiness (the daemon
	// answers) arrives later as an EventReady. On error the slot goes back
	// to warm and nothing of the pod is left.
	Bind(ctx context.Context, req BindRequest) (Slot, error)
	// Release stops the pod's sandbox (TERM, grace, KILL), removes its
	// containers and snapshots, and recycles the slot in the background.
	// Releasing an unknown or already released pod is not an error.
	Release(ctx context.Context, podUID string, grace time.Duration) error
	// Watch returns the current inventory and a stream of every change
	// after it. The channel is closed when ctx ends or the watcher falls
	// too far behind; the caller then watches again.
	Watch(ctx context.Context) (Inventory, <-chan Event, error)
	// Inventory is the node's capacity and slots now.
	Inventory(ctx context.Context) (Inventory, error)
	// Stats is the resource use of a bound pod's sandbox.
	Stats(ctx context.Context, podUID string) (Stats, error)
}

// SlotState is where a slot is in its life.
type SlotState string

const (
	// StateWarm: ready for any image (network namespace with an address).
	StateWarm SlotState = "warm"
	// StateHot: warm, with a started sandbox of one image waiting to be
	// assigned (Slot.Image).
	StateHot SlotState = "hot"
	// StateBinding: a pod is being put into it.
	StateBinding SlotState = "binding"
	// StateBound: a pod's sandbox runs in it.
	StateBound SlotState = "bound"
	// StateReleasing: the pod's sandbox is being removed and the slot recycled.
	StateReleasing SlotState = "releasing"
	// StateBroken: the slot could not be recycled (Slot.Reason says why).
	StateBroken SlotState = "broken"
	// StatePaused: the pod's sandbox is checkpointed to the node's disk
	// (Checkpointer.Pause) and not running: it holds the slot's network
	// namespace and address, no memory or CPU.
	StatePaused SlotState = "paused"
)

// SlotStates are all the states, in the order dashboards list them.
var SlotStates = []SlotState{StateWarm, StateHot, StateBinding, StateBound, StatePaused, StateReleasing, StateBroken}

// NormalizeImage is an image reference's full name, as node agents report
// images (busybox → docker.io/library/busybox:latest).
func NormalizeImage(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", err
	}
	return named.String(), nil
}

// PodRef names the pod a slot holds.
type PodRef struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Slot is one sandbox place on a node.
type Slot struct {
	ID    string    `json:"id"`
	State SlotState `json:"state"`
	// IP is the slot's address (its network namespace's).
	IP string `json:"ip,omitempty"`
	// Image is the bound pod's first image, or a hot slot's image.
	Image string  `json:"image,omitempty"`
	Pod   *PodRef `json:"pod,omitempty"`
	// Resources the bound pod holds.
	Resources Resources `json:"resources,omitzero"`
	// Ready: the bound sandbox's daemon answers.
	Ready  bool      `json:"ready,omitempty"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"`
}

// Clone returns a copy that shares nothing with s.
func (s Slot) Clone() Slot {
	if s.Pod != nil {
		p := *s.Pod
		s.Pod = &p
	}
	return s
}

// Resources are CPU and memory amounts.
type Resources struct {
	// MilliCPU is in thousandths of a core.
	MilliCPU int64 `json:"milli_cpu,omitempty"`
	// MemoryBytes is in bytes.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{MilliCPU: r.MilliCPU + o.MilliCPU, MemoryBytes: r.MemoryBytes + o.MemoryBytes}
}

// Capacity is what a node offers sandboxes.
type Capacity struct {
	Slots     int       `json:"slots"`
	Resources Resources `json:"resources"`
}

// Inventory is a node's capacity and slots at one moment.
type Inventory struct {
	Node     string   `json:"node"`
	Capacity Capacity `json:"capacity"`
	Slots    []Slot   `json:"slots"`
	// ReadyImages are the images unpacked on this node (for placement).
	ReadyImages []string `json:"ready_images,omitempty"`
	// Draining says why the node takes no binds (empty: it does).
	Draining string `json:"draining,omitempty"`
}

// Count returns how many slots are in each state.
func (inv Inventory) Count() map[SlotState]int {
	out := map[SlotState]int{}
	for _, s := range inv.Slots {
		out[s.State]++
	}
	return out
}

// BindRequest is what a pod needs from a slot.
type BindRequest struct {
	Pod PodRef `json:"pod"`
	// Hostname defaults to the pod name.
	Hostname string `json:"hostname,omitempty"`
	// Containers share the slot's network namespace, as in a pod.
	Containers []ContainerSpec `json:"containers"`
	// TokenHashes are hex SHA-256 digests of the bearer tokens the daemon
	// accepts (the creator's and the control plane's).
	TokenHashes []string `json:"token_hashes,omitempty"`
	// AllowUnauthenticated starts the daemon without token checks.
	AllowUnauthenticated bool `json:"allow_unauthenticated,omitempty"`
	// Labels are added to the containers (containerd labels).
	Labels map[string]string `json:"labels,omitempty"`
	// VirtualNode is the virtual node the pod is scheduled on.
	VirtualNode string `json:"virtual_node,omitempty"`
	// PullSecrets are docker config JSON documents for private registries.
	PullSecrets [][]byte `json:"pull_secrets,omitempty"`
	// RestartPolicy is the pod's (Never, OnFailure, Always; empty: Never)
	// for each container's main command: the daemon restarts it in place.
	RestartPolicy string `json:"restart_policy,omitempty"`
	// Egress narrows what the sandbox may reach on the internet to these
	// IPv4 CIDRs (the pod's sandman.io/egress); empty: what the pool
	// allows. It never widens the pool's policy: a pool without internet
	// egress refuses it.
	Egress []string `json:"egress,omitempty"`
	// EgressDeny are IPv4 CIDRs the sandbox may never reach (the pod's
	// sandman.io/egress-deny; sandman.io/egress: none is 0.0.0.0/0), on
	// top of the pool's denied ranges and before the pool's allowed
	// exceptions: it only narrows, so a pool without internet egress takes
	// it too.
	EgressDeny []string `json:"egress_deny,omitempty"`
	// EgressDomains are DNS names the sandbox may reach (the pod's
	// sandman.io/egress-domains: exact, or *.domain for any name under
	// it; CheckEgressDomain): its DNS goes to the node's
	// resolver, which answers only these, and the addresses it answers
	// become reachable for their TTL. Like Egress it narrows internet
	// egress (the pod reaches Egress and these names' addresses) and a
	// pool without internet egress refuses it; the pool's denied ranges
	// and EgressDeny still apply to the addresses.
	EgressDomains []string `json:"egress_domains,omitempty"`
	// ControlPorts are TCP ports and ranges ("8000", "1024-65535") the
	// control plane reaches besides the daemons' ports, nobody else: the
	// node's own addresses and the pods of its control namespaces, whose
	// gateway forwards E2B's getHost traffic (the pod's
	// sandman.io/control-ports).
	ControlPorts []string `json:"control_ports,omitempty"`
	// IngressBandwidth and EgressBandwidth cap the sandbox's traffic in
	// bits per second (the pod's kubernetes.io/ingress-bandwidth and
	// egress-bandwidth); 0: no cap.
	IngressBandwidth int64 `json:"ingress_bandwidth,omitempty"`
	EgressBandwidth  int64 `json:"egress_bandwidth,omitempty"`
	// HostUsers is the pod's hostUsers: false runs the sandbox in a user
	// namespace (root inside is an unprivileged uid on the node), true on
	// the node's users; nil leaves it to the node's default. A node that
	// requires user namespaces refuses true.
	HostUsers *bool `json:"host_users,omitempty"`
	// RuntimeHandler is the pod's RuntimeClass handler: empty or
	// RuntimeHandlerRunc for runc, RuntimeHandlerRunsc for gVisor. A node
	// without gVisor refuses runsc.
	RuntimeHandler string `json:"runtime_handler,omitempty"`
	// Fork, when set, starts the sandbox from a running one's state
	// instead of the image's start (see ForkSource).
	Fork *ForkSource `json:"fork,omitempty"`
	// Restore, when set, starts the sandbox from a checkpoint a node
	// pushed when it moved it away (see MovedCheckpoint): the pod goes on
	// where it stopped, on this node. It must be Pod's (CheckMovedRef).
	Restore *MovedCheckpoint `json:"restore,omitempty"`
}

// The runtime handlers a sandbox runs under (a RuntimeClass's handler).
const (
	RuntimeHandlerRunc  = "runc"
	RuntimeHandlerRunsc = "runsc"
)

// GVisor reports whether the pod runs under gVisor.
func (r BindRequest) GVisor() bool { return r.RuntimeHandler == RuntimeHandlerRunsc }

// ContainerSpec is one container of a pod.
type ContainerSpec struct {
	Name  string `json:"name"`
	Image string `json:"image"`
	// Command and Args follow Kubernetes: Command replaces the image's
	// entrypoint, Args its cmd. With neither, the daemon runs no main
	// process and the sandbox idles until released.
	Command    []string `json:"command,omitempty"`
	Args       []string `json:"args,omitempty"`
	Env        []string `json:"env,omitempty"` // KEY=VALUE
	WorkingDir string   `json:"working_dir,omitempty"`
	// User is "uid" or "uid:gid"; empty: the image's user.
	User string `json:"user,omitempty"`
	// Group, with no User, replaces the primary group of the image's user
	// (a pod's runAsGroup without runAsUser).
	Group *int64 `json:"group,omitempty"`
	// SupplementalGroups are added to the process's groups.
	SupplementalGroups []int64 `json:"supplemental_groups,omitempty"`
	// RunAsNonRoot refuses to start the container as uid 0; with no User
	// the node checks the image's user.
	RunAsNonRoot bool `json:"run_as_non_root,omitempty"`
	// ReadOnlyRootFS mounts the image's filesystem read-only (the daemon
	// keeps its state on a small tmpfs of its own).
	ReadOnlyRootFS bool `json:"read_only_root_fs,omitempty"`
	// DropCapabilities are removed from SandboxCapabilities: CAP_ names,
	// or "ALL" for every one. A pod can only narrow the set, never widen it.
	DropCapabilities []string `json:"drop_capabilities,omitempty"`
	// AllowPrivilegeEscalation runs the container without no_new_privs, so
	// setuid programs (sudo) work inside it; the virtual node sets it only
	// for pods its pool allows (sandman-vk --privilege-escalation-namespaces).
	// The capabilities, seccomp profile and user namespace are unchanged.
	AllowPrivilegeEscalation bool `json:"allow_privilege_escalation,omitempty"`
	// SeccompLocalhost is a seccomp profile (OCI JSON) by its path under
	// the node's profile root, as a pod's seccompProfile Localhost; empty:
	// the runtime's default profile.
	SeccompLocalhost string `json:"seccomp_localhost,omitempty"`
	// PidsLimit bounds the container's processes; the node applies the
	// lower of it and its own limit (0: the node's).
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// Requests and Limits; a limit of 0 means none.
	Requests Resources `json:"requests,omitzero"`
	Limits   Resources `json:"limits,omitzero"`
	// ExclusiveCPUs pins the container to that many whole cores (pods of
	// Guaranteed QoS with integer CPU requests).
	ExclusiveCPUs int `json:"exclusive_cpus,omitempty"`
	// DiskBytes caps what the container may write to its filesystem (its
	// ephemeral-storage limit); 0: the node's default.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// Ports are the container's declared ports: inbound connections to them
	// pass the sandbox's firewall (besides the daemons' ports).
	Ports []Port `json:"ports,omitempty"`
}

// Port is a declared container port.
type Port struct {
	Port int32 `json:"port"`
	// Protocol is TCP (default) or UDP.
	Protocol string `json:"protocol,omitempty"`
}

// SandboxCapabilities are the capabilities a sandbox's processes have:
// containerd's default set without CAP_NET_RAW, CAP_MKNOD, CAP_AUDIT_WRITE
// and CAP_SETFCAP (no raw sockets, device nodes, audit writes or file
// capabilities). A pod may drop from them (DropCapabilities), never add.
var SandboxCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
}

// DefaultSecurity reports whether the container runs as any sandbox of its
// image does before a pod is known: the image's user and groups, a
// writable root, every SandboxCapabilities, the default seccomp profile,
// no_new_privs.
// Only such containers may take a hot slot's running sandbox.
func (c ContainerSpec) DefaultSecurity() bool {
	return c.User == "" && c.Group == nil && len(c.SupplementalGroups) == 0 && !c.RunAsNonRoot &&
		!c.ReadOnlyRootFS && len(c.DropCapabilities) == 0 && c.SeccompLocalhost == "" && !c.AllowPrivilegeEscalation
}

// RootOtherwiseDefault reports whether the container asks to run as uid 0
// (and gid 0, where it names a group) and is otherwise DefaultSecurity: a
// hot sandbox of an image that runs as root runs it as it asks (the E2B
// gateway's template builds are such pods).
func (c ContainerSpec) RootOtherwiseDefault() bool {
	if (c.User != "0" && c.User != "0:0") || (c.Group != nil && *c.Group != 0) {
		return false
	}
	d := c
	d.User, d.Group = "", nil
	return d.DefaultSecurity()
}

// EventType says what an Event reports.
type EventType string

const (
	// EventSlot: a slot changed state (Slot holds the new state).
	EventSlot EventType = "slot"
	// EventReady: the bound sandbox's daemon answers.
	EventReady EventType = "ready"
	// EventExit: a container of a bound sandbox exited.
	EventExit EventType = "exit"
	// EventBindFailed: a bind failed (Reason, Message); the slot is warm again.
	EventBindFailed EventType = "bind_failed"
	// EventDraining: the node is draining (Message says why; sent again as
	// its idle slots are torn down: watchers drop those) or, with no
	// message, stopped.
	EventDraining EventType = "draining"
	// EventImageProgress: bytes of an image pulled so far (Image,
	// BytesDone, BytesTotal); the last one of a pull has Reason Pulled, or
	// ErrImagePull / ImageNotFound with the registry's Message.
	EventImageProgress EventType = "image_progress"
	// EventImages: the set of images ready on the node changed (Images
	// holds all of them).
	EventImages EventType = "images"
)

// Event is one change on a node.
type Event struct {
	Type EventType `json:"type"`
	Time time.Time `json:"time"`
	Slot Slot      `json:"slot"`
	// Container is the container an exit or failure concerns.
	Container string `json:"container,omitempty"`
	ExitCode  int    `json:"exit_code,omitempty"`
	// Reason is a Kubernetes-style reason: Completed, Error, OOMKilled,
	// ErrImagePull, ImageNotFound, InvalidSpec, …
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Image progress.
	Image      string `json:"image,omitempty"`
	BytesDone  int64  `json:"bytes_done,omitempty"`
	BytesTotal int64  `json:"bytes_total,omitempty"`
	// Images ready on the node (EventImages).
	Images []string `json:"images,omitempty"`
	// Moved is where an exit of reason ReasonMoved left the sandbox's
	// running state.
	Moved *MovedCheckpoint `json:"moved,omitempty"`
}

// Drainer is implemented by runtimes that can empty their node: Drain
// refuses binds, evicts and releases every bound sandbox with why, and
// tears idle slots down; Undrain takes binds again.
type Drainer interface {
	Drain(ctx context.Context, why string) error
	Undrain()
}

// ImageCache is implemented by runtimes that prepare images ahead of binds
// (runtime/noderuntime through nodeimage, runtime/fake, the node API client).
type ImageCache interface {
	// PrePull pins images: they are pulled in the background, a bounded
	// number at a time, and kept however full the cache gets.
	PrePull(ctx context.Context, images []string) error
	// Unpin lets pinned images go when the cache needs room.
	Unpin(ctx context.Context, images []string) error
	// ImageStatuses lists the images the node holds, pulls, failed to
	// pull or keeps pinned.
	ImageStatuses(ctx context.Context) ([]ImageStatus, error)
}

// ImageState is where an image is on a node.
type ImageState string

const (
	ImagePending ImageState = "pending" // pinned, pull not started
	ImagePulling ImageState = "pulling"
	ImageReady   ImageState = "ready"
	ImageFailed  ImageState = "failed"
)

// ImageStatus is one image on a node.
type ImageStatus struct {
	// Image is the normalized reference (docker.io/library/busybox:latest).
	Image      string     `json:"image"`
	State      ImageState `json:"state"`
	BytesDone  int64      `json:"bytes_done,omitempty"`
	BytesTotal int64      `json:"bytes_total,omitempty"`
	// SizeBytes is the disk it takes, content and unpacked layers (0 until
	// measured).
	SizeBytes int64     `json:"size_bytes,omitempty"`
	Pinned    bool      `json:"pinned,omitempty"`
	InUse     bool      `json:"in_use,omitempty"`
	LastUsed  time.Time `json:"last_used,omitzero"`
	// Error and ErrorKind (not_found, unauthorized, unreachable,
	// disk_full, invalid, failed) say why the last pull failed.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
}

// Stats is a sandbox's resource use.
type Stats struct {
	Pod  PodRef    `json:"pod"`
	Time time.Time `json:"time"`
	// CPUUsageNanos is cumulative CPU time.
	CPUUsageNanos uint64 `json:"cpu_usage_nanos"`
	// ThrottledNanos and ThrottledPeriods count CFS throttling.
	ThrottledNanos   uint64 `json:"throttled_nanos"`
	ThrottledPeriods uint64 `json:"throttled_periods"`
	// MemoryBytes is the working set; MemoryLimitBytes 0 means none.
	MemoryBytes      uint64 `json:"memory_bytes"`
	MemoryLimitBytes uint64 `json:"memory_limit_bytes"`
	Pids             uint64 `json:"pids"`
	// DiskBytes is what the sandbox's containers wrote to their
	// filesystems (their writable layers), as last measured by the node's
	// disk check; DiskLimitBytes their caps (0: none known).
	DiskBytes      uint64 `json:"disk_bytes,omitempty"`
	DiskLimitBytes uint64 `json:"disk_limit_bytes,omitempty"`
}

// Reasons used in events and errors.
const (
	ReasonCompleted     = "Completed"
	ReasonError         = "Error"
	ReasonOOMKilled     = "OOMKilled"
	ReasonErrImagePull  = "ErrImagePull"
	ReasonImageNotFound = "ImageNotFound"
	ReasonInvalidSpec   = "InvalidSpec"
	ReasonStartFailed   = "StartError"
	// ReasonEvicted: the sandbox was stopped for using more disk than its
	// limit, or by a drain.
	ReasonEvicted = "Evicted"
	// ReasonMoved: a drain checkpointed the sandbox and pushed its state
	// away (Event.Moved) instead of stopping it: a bind that restores it
	// elsewhere (BindRequest.Restore) goes on from there.
	ReasonMoved = "Moved"
)
