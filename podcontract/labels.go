package podcontract

const (
	// LabelPool is a virtual node's pool: its label and its taint key, and
	// so the key of a sandbox pod's nodeSelector and toleration.
	LabelPool = "sandman.io/pool"
	// LabelJob names the trainer job a pod belongs to: the pool's unit of
	// fair admission. sandman-gateway sets e2b-<key name>.
	LabelJob = "sandman.io/job"
	// LabelRun marks the sandboxes one `sandmanctl run` created together.
	LabelRun = "sandman.io/run"
	// LabelE2BSandbox holds the ID of a sandbox made by sandman-gateway
	// (also its pod's name); the gateway watches pods with this label and
	// routes sandbox traffic by it.
	LabelE2BSandbox = "sandman.io/e2b-sandbox"
	// LabelE2BKey is the name of the gateway API key that made a sandbox.
	LabelE2BKey = "sandman.io/e2b-key"
	// LabelE2BBuild marks the sandbox sandman-gateway builds a template
	// in (E2B's Template.build) with the build's ID; it is deleted when
	// the build ends.
	LabelE2BBuild = "sandman.io/e2b-build"
)

// PoolAccessLabelPrefix begins the namespace label of the deployment's
// access convention: a namespace labelled PoolAccessLabelPrefix+<pool>=true
// may use pool <pool> (sandman-vk --allowed-namespace-selector in deploy/).
const PoolAccessLabelPrefix = "pools.sandman.io/"
