package podcontract

// A sandbox pod's annotations, written by its creator.
const (
	// AnnotationTokenSHA256 is the hex SHA-256 of the bearer token the
	// pod's creator keeps (several may be given, separated by commas).
	AnnotationTokenSHA256 = "sandman.io/token-sha256"
	// AnnotationExpiresAt reclaims a sandbox at a time (RFC 3339, e.g.
	// 2026-11-30T18:00:00Z): its pod is deleted then. Unlike
	// spec.activeDeadlineSeconds, which Kubernetes lets only shrink, it may
	// be moved either way while the pod runs; sandman-gateway keeps E2B's
	// sandbox timeout in it.
	AnnotationExpiresAt = "sandman.io/expires-at"
	// AnnotationIdleTimeout reclaims a sandbox after that long (a Go
	// duration, e.g. 30m) with no authenticated daemon call and nothing
	// running in it. A trainer thinking for longer renews (POST /v1/renew
	// on the daemon).
	AnnotationIdleTimeout = "sandman.io/idle-timeout"

	// AnnotationEgress narrows what the sandbox may reach on the internet
	// to these comma-separated IPv4 CIDRs (or addresses), within what its
	// pool allows; EgressNone: nothing at all.
	AnnotationEgress = "sandman.io/egress"
	// EgressNone as AnnotationEgress: the sandbox reaches nothing, not
	// even the pool's exceptions (AnnotationEgressDeny 0.0.0.0/0), on any
	// pool.
	EgressNone = "none"
	// AnnotationEgressDeny lists comma-separated IPv4 CIDRs (or addresses)
	// the sandbox may never reach, the pool's exceptions included. It only
	// narrows, so any pool takes it.
	AnnotationEgressDeny = "sandman.io/egress-deny"
	// AnnotationEgressDomains lists comma-separated DNS names the sandbox
	// may reach: exact (api.example.com) or a wildcard first label
	// (*.example.com: any name under example.com, not example.com). Its
	// DNS then goes to the node's resolver, which answers only these, and
	// it reaches what they resolve to (and AnnotationEgress's CIDRs, if
	// given), within what its pool allows; a pool without internet egress
	// refuses it.
	AnnotationEgressDomains = "sandman.io/egress-domains"
	// AnnotationControlPorts lists comma-separated TCP ports and ranges
	// (8000, 1024-65535) of the sandbox that the control plane reaches
	// besides the daemon's port, and nobody else: the node's own addresses
	// and, where the node enforces NetworkPolicies, the pods of its control
	// namespaces. sandman-gateway sets it so that it can forward E2B's
	// getHost traffic to a sandbox's web servers; the pod's own ingress
	// (its declared ports, who may reach them) is not widened by it.
	AnnotationControlPorts = "sandman.io/control-ports"
	// AnnotationIngressBandwidth and AnnotationEgressBandwidth cap the
	// sandbox's traffic in bits per second (e.g. 10M), the CNI bandwidth
	// plugin's convention.
	AnnotationIngressBandwidth = "kubernetes.io/ingress-bandwidth"
	AnnotationEgressBandwidth  = "kubernetes.io/egress-bandwidth"
)

// AnnotationPause asks the virtual node to pause a sandbox ("true"): its
// running state — processes, memory, open files, listening sockets — is
// checkpointed to its worker's disk and it stops, holding no memory or CPU
// there. Removing it (or any other value) resumes the sandbox where it
// stopped. Only gVisor sandboxes (RuntimeClass gvisor) can be paused; the
// pod's ConditionPaused says where it is.
const AnnotationPause = "sandman.io/pause"

// PauseIdle as AnnotationPause: the virtual node paused the sandbox after
// it sat idle (sandman-vk --auto-pause-after); the next call that reaches
// it through the virtual node (kubectl exec) or sandman-gateway resumes it.
// "true", set by a person or a trainer, is resumed only by removing it.
const PauseIdle = "idle"

// AnnotationOnExpiry says what happens to a sandbox at its
// AnnotationExpiresAt: "delete" (the default) reclaims it; "pause" pauses
// it instead, as AnnotationPause does, and keeps it paused for the virtual
// node's keep time (sandman-vk --keep-paused): the virtual node sets
// AnnotationPause ("true", or PauseIdle with AnnotationResumeOnCall),
// AnnotationPausedAtExpiry, and a new AnnotationExpiresAt, at which the
// sandbox, still paused, is deleted. A sandbox that runs again (resumed)
// is paused again at its next expiry. Only a pod that can be paused (a
// gVisor sandbox of one container) may ask for "pause"; another is
// refused when it is created. A pause that fails at the expiry deletes the
// sandbox, as "delete" would have. sandman-gateway sets it for E2B's
// lifecycle onTimeout "pause".
const AnnotationOnExpiry = "sandman.io/on-expiry"

// What AnnotationOnExpiry may say.
const (
	OnExpiryDelete = "delete"
	OnExpiryPause  = "pause"
)

// AnnotationResumeOnCall, with AnnotationOnExpiry "pause", resumes a
// sandbox paused at its expiry when the next call for it arrives (kubectl
// exec, attach or port-forward through the virtual node, an SDK call or
// port traffic through sandman-gateway), and gives it that much time
// again (a Go duration, e.g. 5m): its AnnotationExpiresAt becomes the
// resume's time plus it. sandman-gateway sets it to the sandbox's timeout
// for E2B's lifecycle autoResume.
const AnnotationResumeOnCall = "sandman.io/resume-on-call"

// AnnotationPausedAtExpiry is written by the virtual node: the expiry (RFC
// 3339) at which it paused the sandbox (AnnotationOnExpiry "pause"). It
// goes once the sandbox runs again.
const AnnotationPausedAtExpiry = "sandman.io/paused-at-expiry"

// AnnotationForkOf makes a pod a live fork of a running sandbox: the name
// of a pod in the same namespace on the same virtual node, a gVisor
// sandbox of one container. The fork starts from that sandbox's processes,
// memory and files as they were when its fork's checkpoint was taken, in a
// slot, address and writable layer of its own, with its own token (the
// source's does not work in it). Its spec must be its source's (image,
// command, user, security; env may differ and does not reach the restored
// processes). sandmanctl fork makes such pods.
const AnnotationForkOf = "sandman.io/fork-of"

// AnnotationForkID groups the forks that start from one checkpoint: pods
// of the same source and ID start from the same moment, and a new ID takes
// a new checkpoint. Default: the pod's UID (a checkpoint of its own).
const AnnotationForkID = "sandman.io/fork-id"

// AnnotationSnapshots names the snapshots taken of a pod: a JSON list of
// vk/api's SnapshotRecord, newest last, at most vk/api's
// MaxSnapshotRecords (the oldest dropped). The virtual node writes it after
// each successful snapshot.
const AnnotationSnapshots = "sandman.io/snapshots"

// What a virtual node with queue room says about its capacity, on its Node.
const (
	// AnnotationSlots is the pool's real capacity: slots, CPU and memory
	// of its healthy workers ("1000 slots, 4000 CPU, 16Ti memory").
	AnnotationSlots = "sandman.io/slots"
	// AnnotationQueueRoom is the room advertised beyond the slots.
	AnnotationQueueRoom = "sandman.io/queue-room"
)

// What a sandbox pod made by sandman-gateway carries besides the above.
const (
	// AnnotationE2BMetadata is the sandbox's E2B metadata, as JSON.
	AnnotationE2BMetadata = "e2b.sandman.io/metadata"
	// AnnotationE2BTemplate is the template ID the sandbox was made from.
	AnnotationE2BTemplate = "e2b.sandman.io/template"
	// AnnotationE2BAlias is the gateway's ConfigMap template name ("" for
	// an image).
	AnnotationE2BAlias = "e2b.sandman.io/alias"
	// AnnotationE2BInternet records E2B's allow_internet_access as asked
	// ("true"/"false"; absent: not asked), for GET /sandboxes/{id}. What
	// enforces it is AnnotationEgress.
	AnnotationE2BInternet = "e2b.sandman.io/allow-internet-access"
	// AnnotationE2BPublicTraffic records E2B's network.allowPublicTraffic
	// as asked ("true"/"false"; absent: not asked, which is public, as in
	// E2B). "false": the gateway forwards to the sandbox's ports only
	// requests carrying its traffic access token.
	AnnotationE2BPublicTraffic = "e2b.sandman.io/allow-public-traffic"
	// AnnotationE2BMaskRequestHost is E2B's network.maskRequestHost: the
	// Host header the sandbox's servers see on requests to their ports
	// (${PORT} stands for the port).
	AnnotationE2BMaskRequestHost = "e2b.sandman.io/mask-request-host"
	// AnnotationE2BHTTPSPorts is E2B's network.httpsPorts: the ports
	// (comma-separated) whose servers speak TLS; the gateway forwards to
	// them over HTTPS, without checking their certificates.
	AnnotationE2BHTTPSPorts = "e2b.sandman.io/https-ports"
)

// AnnotationMoved is written by the virtual node while a pod's sandbox is
// held by no node because it moved (a drain, a resume with no room): the
// JSON of its runtime.MovedCheckpoint ({"ref", "paused", "from",
// "bytes"}). A virtual node that starts (a restart, a standby taking the
// lead) restores such a pod from it instead of reporting it lost. It goes
// once the sandbox runs again.
const AnnotationMoved = "sandman.io/moved"
