package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Validate checks what a bind request needs before any work: a pod UID,
// at least one container with a name and an image, unique names, sane
// resources (whose sum does not wrap), security settings a sandbox can
// honour safely, token hashes the daemon takes, egress lists of IPv4
// CIDRs and allowed DNS names.
// Errors are errdefs.ErrInvalidArgument with what to fix.
func (r BindRequest) Validate() error {
	if r.Pod.UID == "" {
		return fmt.Errorf("bind: pod UID is required: %w", errdefs.ErrInvalidArgument)
	}
	if len(r.Containers) == 0 {
		return fmt.Errorf("bind %s: the pod has no containers: %w", r.Pod.UID, errdefs.ErrInvalidArgument)
	}
	if f := r.Fork; f != nil {
		switch {
		case !r.GVisor():
			return fmt.Errorf("bind %s: a fork runs under gVisor, as its source: set the pod's RuntimeClass to gVisor's (handler %s): %w", r.Pod.UID, RuntimeHandlerRunsc, errdefs.ErrInvalidArgument)
		case len(r.Containers) != 1:
			return fmt.Errorf("bind %s: a fork has one container, as its source: %w", r.Pod.UID, errdefs.ErrInvalidArgument)
		case f.PodUID == "" || f.PodUID == r.Pod.UID:
			return fmt.Errorf("bind %s: a fork needs its source pod's UID, not its own: %w", r.Pod.UID, errdefs.ErrInvalidArgument)
		case !validForkID(f.ID):
			return fmt.Errorf("bind %s: fork ID %q: want 1 to 63 letters, digits, '-' or '.': %w", r.Pod.UID, f.ID, errdefs.ErrInvalidArgument)
		}
	}
	if m := r.Restore; m != nil {
		switch {
		case !r.GVisor() || len(r.Containers) != 1:
			return fmt.Errorf("bind %s: a moved sandbox is restored under gVisor, in one container, as it ran: %w", r.Pod.UID, errdefs.ErrInvalidArgument)
		case r.Fork != nil:
			return fmt.Errorf("bind %s: a bind restores a moved sandbox or forks one, not both: %w", r.Pod.UID, errdefs.ErrInvalidArgument)
		}
		if err := CheckMovedRef(m.Ref, r.Pod); err != nil {
			return fmt.Errorf("bind %s: restore: %w", r.Pod.UID, err)
		}
	}
	seen := map[string]bool{}
	var sum Resources
	for i, c := range r.Containers {
		switch {
		case c.Name == "":
			return fmt.Errorf("bind %s: container %d has no name: %w", r.Pod.UID, i, errdefs.ErrInvalidArgument)
		case seen[c.Name]:
			return fmt.Errorf("bind %s: container name %q used twice: %w", r.Pod.UID, c.Name, errdefs.ErrInvalidArgument)
		case c.Image == "":
			return fmt.Errorf("bind %s: container %q has no image: %w", r.Pod.UID, c.Name, errdefs.ErrInvalidArgument)
		case c.Requests.MilliCPU < 0 || c.Requests.MemoryBytes < 0 || c.Limits.MilliCPU < 0 || c.Limits.MemoryBytes < 0 || c.DiskBytes < 0:
			return fmt.Errorf("bind %s: container %q has a negative resource value: %w", r.Pod.UID, c.Name, errdefs.ErrInvalidArgument)
		case c.Limits.MemoryBytes > 0 && c.Limits.MemoryBytes < 4<<20:
			return fmt.Errorf("bind %s: container %q memory limit %d bytes is below the 4 MiB a sandbox needs: %w", r.Pod.UID, c.Name, c.Limits.MemoryBytes, errdefs.ErrInvalidArgument)
		case c.Limits.MilliCPU > 0 && c.Limits.MilliCPU < 10:
			return fmt.Errorf("bind %s: container %q CPU limit %dm is below 10m: %w", r.Pod.UID, c.Name, c.Limits.MilliCPU, errdefs.ErrInvalidArgument)
		case c.ExclusiveCPUs < 0:
			return fmt.Errorf("bind %s: container %q asks for %d exclusive CPUs: %w", r.Pod.UID, c.Name, c.ExclusiveCPUs, errdefs.ErrInvalidArgument)
		}
		for _, p := range c.Ports {
			if p.Port < 1 || p.Port > 65535 || (p.Protocol != "" && p.Protocol != "TCP" && p.Protocol != "UDP") {
				return fmt.Errorf("bind %s: container %q port %d/%s: want 1-65535, TCP or UDP: %w", r.Pod.UID, c.Name, p.Port, p.Protocol, errdefs.ErrInvalidArgument)
			}
		}
		if err := c.validateSecurity(); err != nil {
			return fmt.Errorf("bind %s: container %q: %w: %w", r.Pod.UID, c.Name, err, errdefs.ErrInvalidArgument)
		}
		seen[c.Name] = true
		// Non-negative values that wrap when added come out negative.
		if sum = sum.Add(c.Requests); sum.MilliCPU < 0 || sum.MemoryBytes < 0 {
			return fmt.Errorf("bind %s: the containers' requests add up to more than any node holds: %w", r.Pod.UID, errdefs.ErrInvalidArgument)
		}
	}
	switch r.RuntimeHandler {
	case "", RuntimeHandlerRunc, RuntimeHandlerRunsc:
	default:
		return fmt.Errorf("bind %s: runtime handler %q: sandboxes run under %s (the default) or %s (gVisor): %w",
			r.Pod.UID, r.RuntimeHandler, RuntimeHandlerRunc, RuntimeHandlerRunsc, errdefs.ErrInvalidArgument)
	}
	switch r.RestartPolicy {
	case "", "Never", "OnFailure", "Always":
	default:
		return fmt.Errorf("bind %s: restart policy %q: want Never, OnFailure or Always: %w", r.Pod.UID, r.RestartPolicy, errdefs.ErrInvalidArgument)
	}
	for _, h := range r.TokenHashes {
		// As the daemon's --token-sha256 reads it.
		if b, err := hex.DecodeString(strings.TrimSpace(h)); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("bind %s: token hash %q: want 64 hex digits (the SHA-256 of a token): %w", r.Pod.UID, h, errdefs.ErrInvalidArgument)
		}
	}
	for _, b := range []int64{r.IngressBandwidth, r.EgressBandwidth} {
		if b < 0 || (b > 0 && b < 1000) || b > 32e9 {
			return fmt.Errorf("bind %s: bandwidth %d bit/s: want 1k to 32G bit/s: %w", r.Pod.UID, b, errdefs.ErrInvalidArgument)
		}
	}
	if err := r.EgressOf().Validate(); err != nil {
		return fmt.Errorf("bind %s: %w", r.Pod.UID, err)
	}
	for _, c := range r.ControlPorts {
		if !validPortRange(c) {
			return fmt.Errorf("bind %s: control port %q: want a port (1-65535) or a range such as 1024-65535: %w", r.Pod.UID, c, errdefs.ErrInvalidArgument)
		}
	}
	if len(r.TokenHashes) == 0 && !r.AllowUnauthenticated {
		return fmt.Errorf("bind %s: no token hash for the daemon and unauthenticated sandboxes are not allowed: %w", r.Pod.UID, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Requests sums the containers' requests.
func (r BindRequest) Requests() Resources {
	var sum Resources
	for _, c := range r.Containers {
		sum = sum.Add(c.Requests)
	}
	return sum
}

// InvalidSpecEvent is the bind-failed event for a request that Validate
// refused: it names the pod (no slot was used) and says what to fix.
func InvalidSpecEvent(req BindRequest, err error, now time.Time) Event {
	pod := req.Pod
	return Event{Type: EventBindFailed, Time: now, Slot: Slot{Pod: &pod, State: StateWarm}, Reason: ReasonInvalidSpec, Message: err.Error()}
}

// capName is a capability as the OCI spec names it.
var capName = regexp.MustCompile(`^CAP_[A-Z0-9_]+$`)

// validateSecurity refuses what a sandbox cannot honour safely, though the
// virtual node has refused it already (the node API is the control
// plane's only, but a request is checked where it is run).
func (c ContainerSpec) validateSecurity() error {
	id := func(what string, v int64) error {
		if v < 0 || v > math.MaxInt32 {
			return fmt.Errorf("%s %d is out of range: want 0 to %d", what, v, math.MaxInt32)
		}
		return nil
	}
	uid := int64(-1)
	if c.User != "" {
		u, g, hasGroup := strings.Cut(c.User, ":")
		n, err := strconv.ParseInt(u, 10, 64)
		if err != nil {
			return fmt.Errorf("user %q: want a numeric uid or uid:gid", c.User)
		}
		if err := id("uid", n); err != nil {
			return err
		}
		uid = n
		if hasGroup {
			n, err := strconv.ParseInt(g, 10, 64)
			if err != nil {
				return fmt.Errorf("user %q: want a numeric uid or uid:gid", c.User)
			}
			if err := id("gid", n); err != nil {
				return err
			}
		}
		if c.Group != nil {
			return errors.New("both user and group are set: give the group in user (uid:gid)")
		}
	}
	if c.Group != nil {
		if err := id("gid", *c.Group); err != nil {
			return err
		}
	}
	for _, g := range c.SupplementalGroups {
		if err := id("supplemental gid", g); err != nil {
			return err
		}
	}
	if c.RunAsNonRoot && uid == 0 {
		return errors.New("runAsNonRoot with user 0: run as a non-zero uid or drop runAsNonRoot")
	}
	for _, cp := range c.DropCapabilities {
		if cp != "ALL" && !capName.MatchString(cp) {
			return fmt.Errorf("capability %q to drop: want a CAP_ name or ALL", cp)
		}
	}
	if p := c.SeccompLocalhost; p != "" && !filepath.IsLocal(p) {
		return fmt.Errorf("seccomp profile %q: want a relative path under the node's profile directory, without \"..\"", p)
	}
	if c.PidsLimit < 0 {
		return fmt.Errorf("pids limit %d is negative", c.PidsLimit)
	}
	return nil
}

// validPortRange says whether s is a TCP port ("8000") or a range of them
// ("1024-65535").
func validPortRange(s string) bool {
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := strconv.ParseUint(lo, 10, 16)
	if err != nil || a == 0 {
		return false
	}
	if !isRange {
		return true
	}
	b, err := strconv.ParseUint(hi, 10, 16)
	return err == nil && b >= a
}

// validForkID: a fork's ID names a directory on the node.
func validForkID(id string) bool {
	if id == "" || len(id) > 63 || id[0] == '.' {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}
