package noderuntime

import (
	"archive/tar"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"syscall"
	"time"

	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandman-dev/sandman/nodeimage"
)

// The parts of a snapshot (snapshot_linux.go, snapshot_image_linux.go)
// that need no node: the name of its image, what of the sandbox's
// filesystem it leaves out, the owners of its files, its image config, how
// a failed push is classed, and the writers that count its bytes.

// checkSnapshotRegistry checks a SnapshotRegistry: host[:port][/path].
func checkSnapshotRegistry(registry string) error {
	host, _, _ := strings.Cut(registry, "/")
	named, err := reference.ParseNamed(registry + "/x")
	if err != nil || !hasRegistryHost(registry+"/x") || reference.Domain(named) != host || strings.HasSuffix(registry, "/") {
		return fmt.Errorf("snapshot registry %q: want host[:port][/path-prefix], e.g. registry.example.com:5000/sandman", registry)
	}
	return nil
}

// hasRegistryHost says whether ref starts with a registry host, as the
// docker reference grammar tells one from a repository path: its first
// component has a dot or a port, or is localhost.
func hasRegistryHost(ref string) bool {
	first, _, ok := strings.Cut(ref, "/")
	return ok && (strings.ContainsAny(first, ".:") || first == "localhost")
}

// snapshotImageName is the full, tagged name of a snapshot's image: ref
// itself when it names a registry host and that is within registry
// (host[:port][/path-prefix]); registry/ref when ref is a repository[:tag]
// alone. A missing tag is latest. Anything else (another registry, outside
// the prefix, a digest, not a reference) is InvalidArgument.
func snapshotImageName(registry, ref string) (string, error) {
	if registry == "" {
		return "", fmt.Errorf("snapshots are off on this node: sandman-node has no --snapshot-registry: %w", errdefs.ErrFailedPrecondition)
	}
	full := ref
	if !hasRegistryHost(ref) {
		full = registry + "/" + ref
	}
	named, err := reference.ParseNamed(full)
	if err != nil {
		return "", fmt.Errorf("snapshot image %q: not an image reference (%v): name it %s/<repository>:<tag> or <repository>:<tag>: %w",
			ref, err, registry, errdefs.ErrInvalidArgument)
	}
	if _, ok := named.(reference.Digested); ok {
		return "", fmt.Errorf("snapshot image %q: a snapshot is named by a tag, not a digest: name it %s/<repository>:<tag> or <repository>:<tag>: %w",
			ref, registry, errdefs.ErrInvalidArgument)
	}
	host, prefix, _ := strings.Cut(registry, "/")
	p := reference.Path(named)
	if reference.Domain(named) != host || (prefix != "" && !strings.HasPrefix(p, prefix+"/")) {
		return "", fmt.Errorf("snapshot image %q is not in this node's snapshot registry %s: name it %s/<repository>:<tag> or give <repository>:<tag>: %w",
			ref, registry, registry, errdefs.ErrInvalidArgument)
	}
	return reference.TagNameOnly(named).String(), nil
}

// sandmanDir is where sandman mounts its own things into every sandbox
// (the daemon's binary and its state tmpfs): the mount points the runtime
// made in the sandbox's writable layer are not the sandbox's changes.
var sandmanDir = path.Dir(DaemonMountPath)

// excludedFromSnapshot says whether a path of a sandbox's filesystem (as
// the sandbox sees it, from /) stays out of its snapshot.
func excludedFromSnapshot(p string) bool {
	return p == sandmanDir || strings.HasPrefix(p, sandmanDir+"/") ||
		p == DaemonStateDir || strings.HasPrefix(p, DaemonStateDir+"/")
}

// Linux file capabilities (security.capability): version 2 holds the
// capabilities for the file's user namespace; version 3, written from
// within a user namespace, also the host uid of that namespace's root.
const (
	vfsCapRevisionMask = 0xff000000
	vfsCapRevision2    = 0x02000000
	vfsCapRevision3    = 0x03000000
	vfsCapV2Size       = 20
	vfsCapV3Size       = 24
	xattrCapability    = "security.capability"
	paxXattrCapability = "SCHILY.xattr." + xattrCapability
)

// unmapID is a host id as a sandbox whose user namespace maps 0-65535 to
// base onwards saw it; ids outside that range are kept.
func unmapID(id int, base uint32) int {
	if id >= int(base) && id < int(base)+idsPerSandbox {
		return id - int(base)
	}
	return id
}

// unmapCapability is a security.capability value as the sandbox saw it: a
// version 3 value whose root is the sandbox's root (base) is version 2
// (what the sandbox wrote), one whose root is another uid of the range
// keeps version 3 with that uid as the sandbox sees it.
func unmapCapability(v string, base uint32) string {
	b := []byte(v)
	if len(b) != vfsCapV3Size || binary.LittleEndian.Uint32(b)&vfsCapRevisionMask != vfsCapRevision3 {
		return v
	}
	root := binary.LittleEndian.Uint32(b[vfsCapV2Size:])
	switch {
	case root == base:
		magic := binary.LittleEndian.Uint32(b)&^vfsCapRevisionMask | vfsCapRevision2
		binary.LittleEndian.PutUint32(b, magic)
		return string(b[:vfsCapV2Size])
	case root > base && root < base+idsPerSandbox:
		binary.LittleEndian.PutUint32(b[vfsCapV2Size:], root-base)
		return string(b)
	}
	return v
}

// unmapLayer copies the layer (a tar stream) src to dst with the owners
// the sandbox saw: the files of a sandbox in a user namespace are owned on
// the node by its host ids (base onwards), and a layer carries the ids of
// the image's world (0-65535), so that any sandbox, in any slot's range or
// none, sees them as the snapshotted one did. base 0 (no user namespace):
// copied as it is.
func unmapLayer(dst io.Writer, src io.Reader, base uint32) error {
	if base == 0 {
		_, err := io.Copy(dst, src)
		return err
	}
	tr := tar.NewReader(src)
	tw := tar.NewWriter(dst)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the layer: %w", err)
		}
		hdr.Uid, hdr.Gid = unmapID(hdr.Uid, base), unmapID(hdr.Gid, base)
		if v, ok := hdr.PAXRecords[paxXattrCapability]; ok {
			hdr.PAXRecords[paxXattrCapability] = unmapCapability(v, base)
		}
		//lint:ignore SA1019 tar.Reader fills Xattrs beside PAXRecords, and tar.Writer prefers them: both must agree.
		if v, ok := hdr.Xattrs[xattrCapability]; ok {
			//lint:ignore SA1019 as above.
			hdr.Xattrs[xattrCapability] = unmapCapability(v, base)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write the layer: %w", err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("copy %s into the layer: %w", hdr.Name, err)
		}
	}
	return tw.Close()
}

// snapshotConfig is a base image config (raw) with one more layer: its
// diff ID appended to rootfs.diff_ids, a history entry, the creation time.
// Every other field (Docker's too) is kept as it was.
func snapshotConfig(raw []byte, diffID digest.Digest, baseLayers int, createdBy string, now time.Time) ([]byte, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, err
	}
	var rootfs ocispec.RootFS
	if err := json.Unmarshal(cfg["rootfs"], &rootfs); err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	if len(rootfs.DiffIDs) != baseLayers {
		return nil, fmt.Errorf("%d diff IDs for %d layers", len(rootfs.DiffIDs), baseLayers)
	}
	rootfs.DiffIDs = append(rootfs.DiffIDs, diffID)
	var history []ocispec.History
	if h, ok := cfg["history"]; ok {
		if err := json.Unmarshal(h, &history); err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
	}
	history = append(history, ocispec.History{Created: &now, CreatedBy: createdBy})
	for k, v := range map[string]any{"rootfs": rootfs, "history": history, "created": now} {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		cfg[k] = b
	}
	return json.Marshal(cfg)
}

// pushError classes a failed push: the registry refused it
// (Unauthenticated without or with wrong credentials, PermissionDenied
// when they may not push there), did not answer (Unavailable), or the rest.
func pushError(registry, name string, err error) error {
	var status remoteerrors.ErrUnexpectedStatus
	switch nodeimage.Classify(err) {
	case nodeimage.KindUnauthorized:
		if errors.As(err, &status) && status.StatusCode == http.StatusForbidden {
			return fmt.Errorf("the snapshot registry %s refused the push of %s: %v: give sandman-node credentials that may push there (--snapshot-push-config): %w",
				registry, name, err, errdefs.ErrPermissionDenied)
		}
		return fmt.Errorf("the snapshot registry %s refused the push of %s: %v: give sandman-node credentials for it (--snapshot-push-config): %w",
			registry, name, err, errdefs.ErrUnauthenticated)
	case nodeimage.KindNotFound:
		if errors.As(err, &status) {
			// The registry's 404 (NAME_UNKNOWN): no such repository for these credentials.
			return fmt.Errorf("the snapshot registry %s refused the push of %s: %v: %w", registry, name, err, errdefs.ErrPermissionDenied)
		}
		// A blob missing from the node's content store (a base layer the
		// node discarded after unpacking): not the registry's doing.
		return fmt.Errorf("push %s to the snapshot registry %s: %v: %w", name, registry, err, errdefs.ErrFailedPrecondition)
	case nodeimage.KindUnreachable:
		return fmt.Errorf("push %s: the snapshot registry %s did not answer: %v: %w", name, registry, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("push %s to the snapshot registry %s: %w", name, registry, err)
}

// diskFull says whether err is the disk (or a quota) filling up, here or
// in containerd (whose errors keep only the message).
func diskFull(err error) bool {
	msg := err.Error()
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		strings.Contains(msg, "no space left on device") || strings.Contains(msg, "disk quota exceeded")
}

// progressWriter counts what goes through it and reports the count at
// most every `every`.
type progressWriter struct {
	w      io.Writer
	n      int64
	every  time.Duration
	last   time.Time
	report func(int64)
}

// countWriter counts what goes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
