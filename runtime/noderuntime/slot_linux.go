package noderuntime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/pkg/netns"
	gocni "github.com/containerd/go-cni"
	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/runtime"
)

// slot is a runtime.Slot with what the node needs to run it.
type slot struct {
	runtime.Slot
	netns *netns.NetNS
	dir   string
	// group is the runc shim group the slot's containers join.
	group string
	// heating: a hot sandbox is being started in this warm slot.
	heating bool
	// assignToken assigns the waiting daemon of a hot slot.
	assignToken string
	// idBase is the first host id of the slot's user namespace range (0:
	// none taken yet; see userns_linux.go). userNS: the hot sandbox waiting
	// in the slot runs in a user namespace.
	idBase uint32
	userNS bool
	// hotRoot: the hot sandbox's process runs as uid 0 and gid 0 (its
	// image's user is root).
	hotRoot bool
	// diskLimits are the bound pod's per-container disk caps (bytes), by
	// container ID; diskUsed what each wrote, as the disk check last
	// measured it (Stats reports it); evicted says why the sandbox was
	// stopped, if it was.
	diskLimits map[string]int64
	diskUsed   map[string]int64
	evicted    string
	// lazyLowers are each container's lazily pulled layers, as the lazy
	// check first found them (watchLazyLayers).
	lazyLowers map[string][]lazyLower
	// containers are the bound pod's containerd container IDs, in order.
	containers []string
	// stale is the hot sandbox of another image a bind took this slot
	// from (reserve, when no other slot was free); the bind removes it.
	stale []string
	// leftovers are the containers (and their snapshots) a broken slot
	// could not remove; repairBroken tries again.
	leftovers []string
	repairing bool
	// earlyExits are exits of the pod's containers that came while its
	// bind had not returned yet; Bind publishes them once bound.
	earlyExits []runtime.Event
	// shaped: bandwidth caps are set on the slot's interfaces.
	shaped bool
	// fwClean: the slot's firewall is its base (no pod's parts), so a bind
	// only adds to it.
	fwClean bool
	// fwReq is what the bound pod's firewall is made from (its ref, ports
	// and egress), kept to write it again when policies change.
	fwReq *runtime.BindRequest
	// egressing: a SetEgress is rewriting its firewall.
	egressing bool
	// stopReady ends the readiness poll of the bound pod.
	stopReady context.CancelFunc
	// snapshots counts the snapshots reading the bound pod's filesystem
	// (freezing it and writing its changes): a release waits for them.
	snapshots int
	// forking counts the fork checkpoints being taken of the bound pod's
	// sandbox (fork_linux.go): a release or a pause waits for them.
	forking int
	// pausing: a pause is checkpointing the bound pod's sandbox; exits
	// meanwhile wait in pauseExits (published if the pause fails). epoch
	// counts the pauses: an exit watch of an earlier epoch (a task the
	// pause ended) reports nothing. checkpointBytes: the paused sandbox's
	// checkpoint size.
	pausing    bool
	pauseExits []runtime.Event
	// moving: a move is pushing the paused sandbox away; a resume waits
	// (Unavailable).
	moving          bool
	epoch           int
	checkpointBytes int64
}

// slotMeta is persisted in the slot's directory so a restarted agent can
// find the slot's namespace and address.
type slotMeta struct {
	ID    string `json:"id"`
	NetNS string `json:"netns"`
	IP    string `json:"ip"`
}

func (r *Runtime) slotsDir() string { return filepath.Join(r.cfg.StateDir, "slots") }
func (r *Runtime) netnsDir() string { return filepath.Join(r.cfg.StateDir, "netns") }

func newSlotID() string { return "slot-" + randHex(5) }

// randHex is n random bytes in hex.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// makeSlot creates a warm slot: a network namespace set up by CNI and a
// state directory. On error nothing of it is left.
func (r *Runtime) makeSlot(ctx context.Context) (s *slot, retErr error) {
	id := newSlotID()
	r.mu.Lock()
	group := r.joinGroupLocked()
	r.mu.Unlock()
	defer func() {
		if retErr != nil {
			_ = r.leaveGroup(context.WithoutCancel(ctx), group)
		}
	}()
	if r.grouped() {
		// The group's shim runs before the slot is warm: its first bind
		// does not start it.
		if err := r.ensureHolder(ctx, group); err != nil {
			return nil, fmt.Errorf("slot %s: %w", id, err)
		}
	}
	dir := filepath.Join(r.slotsDir(), id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	ns, err := netns.NewNetNS(r.netnsDir())
	if err != nil {
		return nil, fmt.Errorf("slot %s: network namespace: %w", id, err)
	}
	defer func() {
		if retErr != nil {
			_ = ns.Remove()
		}
	}()
	// Recorded before CNI runs: an agent killed during the setup leaves
	// its successor's recovery the namespace to delete, with the address.
	if err := writeMeta(dir, slotMeta{ID: id, NetNS: ns.GetPath()}); err != nil {
		return nil, err
	}
	// Deleted on any failure, the setup's own included: a plugin that
	// fails (or is cut off) after the IPAM plugin gave an address would
	// otherwise keep it (the CNI spec has the runtime call DEL then).
	defer func() {
		if retErr != nil {
			_ = r.cni.Remove(context.WithoutCancel(ctx), id, ns.GetPath())
		}
	}()
	res, err := r.cni.Setup(ctx, id, ns.GetPath())
	if err != nil {
		return nil, fmt.Errorf("slot %s: CNI setup: %w", id, err)
	}
	ip := resultIP(res)
	if ip == "" {
		return nil, fmt.Errorf("slot %s: CNI gave no address", id)
	}
	if _, err := r.firewall(ns.GetPath(), ip, nil, false); err != nil {
		return nil, fmt.Errorf("slot %s: %w", id, err)
	}
	if err := allowLowPorts(ns.GetPath()); err != nil {
		return nil, fmt.Errorf("slot %s: %w", id, err)
	}
	if err := writeMeta(dir, slotMeta{ID: id, NetNS: ns.GetPath(), IP: ip}); err != nil {
		return nil, err
	}
	return &slot{
		Slot:  runtime.Slot{ID: id, State: runtime.StateWarm, IP: ip, Since: r.cfg.Clock.Now()},
		netns: ns,
		dir:   dir,
		group: group, fwClean: true,
	}, nil
}

// destroySlot tears a slot's network down and removes its directory.
func (r *Runtime) destroySlot(ctx context.Context, id, nsPath, dir string) error {
	var errs []error
	if dir != "" {
		// First: the slot's sysfs holds its network namespace.
		if err := unmountSlotSysfs(dir); err != nil {
			return err // never remove what is under a mount
		}
	}
	if nsPath != "" {
		if err := r.cni.Remove(ctx, id, nsPath); err != nil {
			errs = append(errs, fmt.Errorf("CNI remove: %w", err))
		}
		if err := netns.LoadNetNS(nsPath).Remove(); err != nil {
			errs = append(errs, fmt.Errorf("remove netns: %w", err))
		}
	}
	if dir != "" {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func resultIP(res *gocni.Result) string {
	for name, iface := range res.Interfaces {
		if name == "lo" || strings.HasPrefix(name, "veth") {
			continue
		}
		for _, c := range iface.IPConfigs {
			if c.IP != nil && c.IP.To4() != nil && !c.IP.IsLoopback() {
				return c.IP.String()
			}
		}
	}
	return ""
}

// netnsMounted reports whether path is a mounted network namespace.
func netnsMounted(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

func writeMeta(dir string, m slotMeta) error {
	b, _ := json.Marshal(m)
	return os.WriteFile(filepath.Join(dir, "slot.json"), b, 0o600)
}

func readMeta(dir string) (slotMeta, error) {
	var m slotMeta
	b, err := os.ReadFile(filepath.Join(dir, "slot.json"))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

// bindGroupLocked is the shim group for the next pod in s: its slot's
// group (Config.ShimGroupSize > 1), or a fresh one per bind, so a bind never
// meets the shim of its slot's previous pod on its way out.
func (r *Runtime) bindGroupLocked(s *slot) string {
	if !r.grouped() {
		s.group = newGroupName(r.cfg.Node)
	}
	return s.group
}
