package noderuntime

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/klauspost/compress/gzip"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// Snapshots (runtime.Snapshotter, issue 18). A snapshot takes what one
// container of a bound sandbox changed in its filesystem as one new layer
// over its image:
//
//  1. Freeze: every task of the pod is paused (containerd's Task.Pause, the
//     cgroup freezer), so nothing changes while the changes are read.
//  2. Diff: the container's overlay upper directory is walked against a
//     read-only view of its image (continuity's overlay diff: whiteouts and
//     opaque directories become OCI whiteouts), and the changes are
//     written, uncompressed, to a file in SnapshotScratchDir: the freeze
//     lasts as long as writing them does. sandman's own mount points
//     (/.sandman) are left out. The tasks are resumed, whatever happened,
//     with a context that outlives the caller's.
//  3. Commit, the sandbox running again: the owners are turned back into
//     the ids the sandbox saw (a sandbox in a user namespace writes files
//     owned by its slot's host ids), the layer is gzipped into containerd's
//     content store, and an image is recorded: the base image's config with
//     the new diff ID and a history entry, an OCI manifest of the base's
//     layers and the new one. It is unpacked into the slot snapshotter (only
//     the new layer is applied: the base chain is there).
//  4. Push to the snapshot registry (the node's registry settings; the
//     credentials of SnapshotPushConfig), then the image is handed to the
//     image manager: an ordinary cached image, ready for forks on this
//     node without a pull, with its access unknown (the registry is asked
//     once, as for any image not pulled by this agent).
//
// Only the filesystem is taken: processes and memory are not.

// snapshotTarget is the container a snapshot takes.
type snapshotTarget struct {
	slot *slot
	pod  runtime.PodRef
	// id is the containerd container, name the pod's container; all are
	// the pod's containers (every one is frozen).
	id, name string
	all      []string
	// image is the image it runs (containerd's name), snapshotKey its
	// writable snapshot, idBase the first host id of its user namespace
	// (0: none).
	image       string
	snapshotKey string
	idBase      uint32
}

// Snapshot implements runtime.Snapshotter. A release of the pod that
// arrives while its sandbox is frozen and its changes are written waits
// for that (the sandbox is running again by then); it does not wait for the
// commit or the push, which no longer read the sandbox.
func (r *Runtime) Snapshot(ctx context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (res runtime.SnapshotResult, retErr error) {
	begin := time.Now()
	if progress == nil {
		progress = func(runtime.SnapshotProgress) {}
	}
	ctx = r.nsCtx(ctx)
	log := r.log.With("pod_uid", req.PodUID, "image", req.Image)
	defer func() {
		if retErr != nil && diskFull(retErr) && !errdefs.IsResourceExhausted(retErr) {
			retErr = fmt.Errorf("the node's disk is full: %v: %w", retErr, errdefs.ErrResourceExhausted)
		}
		r.metrics.snapshots.WithLabelValues(runtime.SnapshotOutcome(retErr)).Inc()
		if res.Frozen > 0 {
			r.metrics.frozenSeconds.Observe(res.Frozen.Seconds())
		}
		if retErr != nil {
			log.Warn("snapshot failed", "err", retErr, "frozen", res.Frozen)
			res = runtime.SnapshotResult{}
			return
		}
		res.Duration = time.Since(begin)
		r.metrics.snapshotSeconds.Observe(res.Duration.Seconds())
		log.Info("snapshot taken", "digest", res.Digest, "layer_bytes", res.LayerBytes, "diff_bytes", res.DiffBytes,
			"frozen", res.Frozen, "duration", res.Duration)
	}()
	name, err := snapshotImageName(r.cfg.SnapshotRegistry, req.Image)
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s: %w", req.PodUID, err)
	}
	t, err := r.holdForSnapshot(req)
	if err != nil {
		return res, err
	}
	held := true
	unhold := func() {
		if held {
			r.mu.Lock()
			t.slot.snapshots--
			r.mu.Unlock()
			held = false
		}
	}
	defer unhold()
	// A namespace writes only its own snapshots: naming another's would
	// replace what its pods start.
	if err := r.images.Snapshots().CheckWrite(name, t.pod.Namespace); err != nil {
		return res, fmt.Errorf("snapshot of pod %s/%s: %w", t.pod.Namespace, t.pod.Name, err)
	}
	if err := r.inspectSnapshotTarget(ctx, t); err != nil {
		return res, err
	}
	log = log.With("pod", t.pod.Namespace+"/"+t.pod.Name, "slot", t.slot.ID, "container", t.name)
	auth, err := r.snapshotPushAuth()
	if err != nil {
		return res, err
	}
	if err := os.MkdirAll(r.cfg.SnapshotScratchDir, 0o700); err != nil {
		return res, fmt.Errorf("snapshot of pod %s: scratch directory: %w", req.PodUID, err)
	}
	scratch, err := os.CreateTemp(r.cfg.SnapshotScratchDir, "layer-*.tar")
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s: scratch file: %w", req.PodUID, err)
	}
	defer func() {
		scratch.Close()
		os.Remove(scratch.Name())
	}()

	res.Frozen, err = r.freezeAndDiff(ctx, t, scratch, progress)
	unhold()
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s container %s: %w", req.PodUID, t.name, err)
	}
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotCommit})

	// What is written from here is under a lease until the image record
	// holds it; a failure deletes the lease synchronously, so nothing of
	// the attempt stays on the node.
	ls := r.client.LeasesService()
	lease, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s: lease: %w", req.PodUID, err)
	}
	defer func() {
		var opts []leases.DeleteOpt
		if retErr != nil {
			opts = append(opts, leases.SynchronousDelete)
		}
		if err := ls.Delete(context.WithoutCancel(ctx), lease, opts...); err != nil {
			log.Warn("remove a snapshot's lease", "lease", lease.ID, "err", err)
		}
	}()
	ctx = leases.WithLease(ctx, lease.ID)
	layer, diffID, diffBytes, err := r.writeLayer(ctx, scratch, t.idBase)
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s: write the layer: %w", req.PodUID, err)
	}
	scratch.Close()
	os.Remove(scratch.Name()) // the room it took is free before the push
	createdBy := fmt.Sprintf("sandman snapshot of %s/%s container %s", t.pod.Namespace, t.pod.Name, t.name)
	manifest, err := r.writeSnapshotImage(ctx, t.image, layer, diffID, createdBy)
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s: write the image: %w", req.PodUID, err)
	}
	undo, err := r.recordImage(ctx, name, manifest)
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s: record image %s: %w", req.PodUID, name, err)
	}
	defer func() {
		if retErr != nil {
			if err := undo(context.WithoutCancel(ctx)); err != nil {
				log.Warn("remove the image of a failed snapshot", "err", err)
			}
		}
	}()
	img, err := r.client.GetImage(ctx, name)
	if err == nil {
		err = img.Unpack(ctx, r.cfg.Snapshotter)
	}
	if err != nil {
		return res, fmt.Errorf("snapshot of pod %s: unpack %s: %w", req.PodUID, name, err)
	}
	if err := r.pushSnapshot(ctx, name, manifest, layer, auth, progress); err != nil {
		return res, fmt.Errorf("snapshot of pod %s: %w", req.PodUID, err)
	}
	if err := r.images.Adopt(ctx, name); err != nil {
		return res, fmt.Errorf("snapshot of pod %s: %w", req.PodUID, err)
	}
	r.adoptByDigest(ctx, name, manifest)
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotDone})
	res.Image, res.Digest, res.BaseImage = name, manifest.Digest.String(), t.image
	res.Layer, res.LayerBytes, res.DiffBytes = layer.Digest.String(), layer.Size, diffBytes
	return res, nil
}

// holdForSnapshot finds the bound pod's container and keeps its slot from
// being released until the caller lets it go (slot.snapshots).
func (r *Runtime) holdForSnapshot(req runtime.SnapshotRequest) (*snapshotTarget, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byPod[req.PodUID]
	if !ok || s.Pod == nil {
		return nil, fmt.Errorf("snapshot: pod %s is not on node %s: %w", req.PodUID, r.cfg.Node, errdefs.ErrNotFound)
	}
	if s.State != runtime.StateBound {
		return nil, fmt.Errorf("snapshot: pod %s is %s on node %s, not bound: snapshot it once it is bound: %w",
			req.PodUID, s.State, r.cfg.Node, errdefs.ErrFailedPrecondition)
	}
	names := make([]string, len(s.containers))
	for i, id := range s.containers {
		names[i] = strings.TrimPrefix(id, s.ID+"-")
	}
	t := &snapshotTarget{slot: s, pod: *s.Pod, all: slices.Clone(s.containers)}
	switch i := slices.Index(names, req.Container); {
	case req.Container == "" && len(names) == 1:
		t.id, t.name = s.containers[0], names[0]
	case req.Container == "":
		return nil, fmt.Errorf("snapshot: pod %s has containers %s: say which to take (container): %w",
			req.PodUID, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
	case i < 0:
		return nil, fmt.Errorf("snapshot: pod %s has no container %q (it has %s): %w",
			req.PodUID, req.Container, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
	default:
		t.id, t.name = s.containers[i], names[i]
	}
	s.snapshots++
	return t, nil
}

// inspectSnapshotTarget reads the container's image, snapshot and user
// namespace; a gVisor sandbox is refused.
func (r *Runtime) inspectSnapshotTarget(ctx context.Context, t *snapshotTarget) error {
	c, err := r.client.LoadContainer(ctx, t.id)
	if err != nil {
		return fmt.Errorf("snapshot: container %s: %w", t.id, err)
	}
	info, err := c.Info(ctx, ctrd.WithoutRefreshedMetadata)
	if err != nil {
		return fmt.Errorf("snapshot: container %s: %w", t.id, err)
	}
	if info.Labels[LabelRuntimeHandler] == runtime.RuntimeHandlerRunsc {
		// runsc (--overlay2=none) writes the same upper directory, but
		// its Sentry may hold written data in its own page cache, which a
		// pause does not flush: refused until shown to be consistent.
		return fmt.Errorf("snapshot of pod %s: snapshots of gVisor sandboxes are not supported: %w", t.pod.UID, errdefs.ErrFailedPrecondition)
	}
	if info.Snapshotter != r.cfg.Snapshotter || info.SnapshotKey == "" || info.Image == "" {
		return fmt.Errorf("snapshot of pod %s: container %s has no %s snapshot of an image: %w", t.pod.UID, t.id, r.cfg.Snapshotter, errdefs.ErrFailedPrecondition)
	}
	t.image, t.snapshotKey = info.Image, info.SnapshotKey
	if v := info.Labels[LabelUserNS]; v != "" {
		base, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return fmt.Errorf("snapshot of pod %s: label %s=%q: %w", t.pod.UID, LabelUserNS, v, errdefs.ErrFailedPrecondition)
		}
		t.idBase = uint32(base)
	}
	return nil
}

// snapshotPushAuth reads the push credentials (nil: none).
func (r *Runtime) snapshotPushAuth() ([][]byte, error) {
	if r.cfg.SnapshotPushConfig == "" {
		return nil, nil
	}
	b, err := os.ReadFile(r.cfg.SnapshotPushConfig)
	if err != nil {
		return nil, fmt.Errorf("snapshot: read the push credentials (--snapshot-push-config): %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	return [][]byte{b}, nil
}

// freezeAndDiff writes the container's changes to w as an uncompressed
// layer while every task of the pod is paused; it returns how long they
// were. The tasks are resumed before it returns, whatever happened.
func (r *Runtime) freezeAndDiff(ctx context.Context, t *snapshotTarget, w io.Writer, progress func(runtime.SnapshotProgress)) (frozen time.Duration, retErr error) {
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	info, err := sn.Stat(ctx, t.snapshotKey)
	if err != nil {
		return 0, fmt.Errorf("snapshot %s: %w", t.snapshotKey, err)
	}
	mounts, err := sn.Mounts(ctx, t.snapshotKey)
	if err != nil {
		return 0, fmt.Errorf("snapshot %s: %w", t.snapshotKey, err)
	}
	upper, err := upperDir(mounts)
	if err != nil {
		return 0, err
	}
	// The image as the container started from it, read-only.
	viewKey := "sandman-snapshot-view-" + randomHex()
	lower, err := sn.View(ctx, viewKey, info.Parent)
	if err != nil {
		return 0, fmt.Errorf("view of the image's snapshot: %w", err)
	}
	defer func() {
		if err := sn.Remove(context.WithoutCancel(ctx), viewKey); err != nil && !errdefs.IsNotFound(err) {
			retErr = errors.Join(retErr, fmt.Errorf("remove view %s: %w", viewKey, err))
		}
	}()
	err = mount.WithReadonlyTempMount(ctx, lower, func(lowerRoot string) (retErr error) {
		progress(runtime.SnapshotProgress{Phase: runtime.SnapshotFreeze})
		start := time.Now()
		resume, err := r.freeze(ctx, t.all)
		defer func() {
			if err := resume(); err != nil {
				r.log.Error("resume a snapshotted sandbox", "slot", t.slot.ID, "err", err)
				retErr = errors.Join(retErr, err)
			}
			frozen = time.Since(start)
		}()
		if err != nil {
			return err
		}
		bw := bufio.NewWriterSize(w, 1<<20)
		pw := &progressWriter{w: bw, every: 100 * time.Millisecond, report: func(n int64) {
			progress(runtime.SnapshotProgress{Phase: runtime.SnapshotDiff, BytesDone: n})
		}}
		if err := writeUpperDiff(ctx, pw, lowerRoot, upper); err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return fmt.Errorf("write the changes: %w", err)
		}
		pw.report(pw.n)
		return nil
	})
	return frozen, err
}

// writeUpperDiff writes the changes of an overlay upper directory against
// the lower tree it covers as a tar stream with OCI whiteouts, without
// sandman's own mount points.
func writeUpperDiff(ctx context.Context, w io.Writer, lowerRoot, upper string) error {
	cw := archive.NewChangeWriter(w, upper)
	err := fs.DiffDirChanges(ctx, lowerRoot, upper, fs.DiffSourceOverlayFS, func(k fs.ChangeKind, p string, f os.FileInfo, err error) error {
		if excludedFromSnapshot(p) {
			if k != fs.ChangeKindDelete && f != nil && f.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if k != fs.ChangeKindDelete && f != nil && isWhiteout(f) {
			// An overlay whiteout the diff did not take for a deletion: it
			// follows links in the lower tree with stat, so a deleted link
			// whose target is not there looks like a new device. Lstat
			// says: a deletion, or (nothing below) nothing at all.
			if _, err := os.Lstat(filepath.Join(lowerRoot, p)); err != nil {
				return nil
			}
			return cw.HandleChange(fs.ChangeKindDelete, p, nil, nil)
		}
		return cw.HandleChange(k, p, f, err)
	})
	if err != nil {
		return fmt.Errorf("write the changes: %w", err)
	}
	return cw.Close()
}

// isWhiteout: an overlay whiteout is a 0/0 character device.
func isWhiteout(f os.FileInfo) bool {
	st, ok := f.Sys().(*syscall.Stat_t)
	return ok && f.Mode()&os.ModeCharDevice != 0 && st.Rdev == 0
}

// upperDir is the directory an active overlay snapshot writes to.
func upperDir(mounts []mount.Mount) (string, error) {
	if len(mounts) == 1 {
		m := mounts[0]
		switch m.Type {
		case "overlay":
			for _, o := range m.Options {
				if v, ok := strings.CutPrefix(o, "upperdir="); ok {
					return v, nil
				}
			}
		case "bind":
			// An active snapshot without a parent: its directory is all.
			return m.Source, nil
		}
	}
	return "", fmt.Errorf("the container's snapshot is not an overlay (%d mounts): snapshots need the overlayfs snapshotter: %w", len(mounts), errdefs.ErrFailedPrecondition)
}

// freeze pauses the running tasks of containers ids. resume resumes those
// it paused, with a context that outlives ctx; it must be called, also
// when freeze fails.
func (r *Runtime) freeze(ctx context.Context, ids []string) (resume func() error, err error) {
	var paused []ctrd.Task
	resume = func() error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		var errs []error
		for _, task := range paused {
			if err := task.Resume(rctx); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("resume %s: %w", task.ID(), err))
			}
		}
		return errors.Join(errs...)
	}
	for _, id := range ids {
		c, err := r.client.LoadContainer(ctx, id)
		if err != nil {
			return resume, fmt.Errorf("freeze %s: %w", id, err)
		}
		task, err := c.Task(ctx, nil)
		if errdefs.IsNotFound(err) {
			continue // exited and gone: nothing to freeze
		}
		if err != nil {
			return resume, fmt.Errorf("freeze %s: %w", id, err)
		}
		st, err := task.Status(ctx)
		if err != nil {
			return resume, fmt.Errorf("freeze %s: %w", id, err)
		}
		if st.Status != ctrd.Running {
			continue
		}
		if err := task.Pause(ctx); err != nil {
			// It may have paused all the same (the call cut short): a
			// resume of a task that runs does no harm.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			_ = task.Resume(rctx)
			cancel()
			return resume, fmt.Errorf("freeze %s: %w", id, err)
		}
		paused = append(paused, task)
	}
	return resume, nil
}

// writeLayer turns the uncompressed changes in f into the snapshot's
// layer in the content store: owners as the sandbox saw them (idBase),
// gzipped. It returns the layer's descriptor, its diff ID (digest of the
// uncompressed tar) and its uncompressed size.
func (r *Runtime) writeLayer(ctx context.Context, f *os.File, idBase uint32) (ocispec.Descriptor, digest.Digest, int64, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	cs := r.client.ContentStore()
	ref := "sandman-snapshot-layer-" + randomHex()
	cw, err := content.OpenWriter(ctx, cs, content.WithRef(ref))
	if err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	committed := false
	defer func() {
		cw.Close()
		if !committed {
			_ = cs.Abort(context.WithoutCancel(ctx), ref)
		}
	}()
	compressed := &countWriter{w: cw}
	gz, err := gzip.NewWriterLevel(compressed, gzip.BestSpeed)
	if err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	diffID := digest.SHA256.Digester()
	uncompressed := &countWriter{w: io.MultiWriter(gz, diffID.Hash())}
	if err := unmapLayer(uncompressed, bufio.NewReaderSize(f, 1<<20), idBase); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	if err := gz.Close(); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	dgst := cw.Digest()
	labels := map[string]string{"containerd.io/uncompressed": diffID.Digest().String()}
	if err := cw.Commit(ctx, compressed.n, dgst, content.WithLabels(labels)); err != nil {
		if !errdefs.IsAlreadyExists(err) {
			return ocispec.Descriptor{}, "", 0, fmt.Errorf("commit: %w", err)
		}
		if _, err := cs.Update(ctx, content.Info{Digest: dgst, Labels: labels}, "labels.containerd.io/uncompressed"); err != nil {
			return ocispec.Descriptor{}, "", 0, err
		}
	}
	committed = true
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: dgst, Size: compressed.n}, diffID.Digest(), uncompressed.n, nil
}

// writeSnapshotImage writes the snapshot's config and manifest: the base
// image's config (every field kept) with the new diff ID and a history
// entry, and an OCI manifest of the base's layers (Docker media types
// become their OCI equivalents: the same bytes) and the new one. The
// manifest carries containerd's GC labels for its children.
func (r *Runtime) writeSnapshotImage(ctx context.Context, baseName string, layer ocispec.Descriptor, diffID digest.Digest, createdBy string) (ocispec.Descriptor, error) {
	cs := r.client.ContentStore()
	base, err := r.client.GetImage(ctx, baseName)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("base image %s: %w", baseName, err)
	}
	manifest, err := images.Manifest(ctx, cs, base.Target(), base.Platform())
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("manifest of %s: %w", baseName, err)
	}
	raw, err := content.ReadBlob(ctx, cs, manifest.Config)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("config of %s: %w", baseName, err)
	}
	config, err := snapshotConfig(raw, diffID, len(manifest.Layers), createdBy, time.Now().UTC())
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("config of %s: %w", baseName, err)
	}
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))}
	if err := content.WriteBlob(ctx, cs, "sandman-snapshot-config-"+randomHex(), bytes.NewReader(config), configDesc); err != nil {
		return ocispec.Descriptor{}, err
	}
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Annotations: map[string]string{
			ocispec.AnnotationBaseImageName:   baseName,
			ocispec.AnnotationBaseImageDigest: base.Target().Digest.String(),
		},
	}
	for _, l := range manifest.Layers {
		if l.MediaType == images.MediaTypeDockerSchema2LayerGzip {
			l.MediaType = ocispec.MediaTypeImageLayerGzip
		}
		m.Layers = append(m.Layers, l)
	}
	m.Layers = append(m.Layers, layer)
	b, err := json.Marshal(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	labels := map[string]string{"containerd.io/gc.ref.content.config": configDesc.Digest.String()}
	for i, l := range m.Layers {
		labels["containerd.io/gc.ref.content.l."+strconv.Itoa(i)] = l.Digest.String()
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(ctx, cs, "sandman-snapshot-manifest-"+randomHex(), bytes.NewReader(b), desc, content.WithLabels(labels)); err != nil {
		return ocispec.Descriptor{}, err
	}
	return desc, nil
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

// recordImage creates (or points) the image record name at target. undo
// puts back what was there: no record, or the previous one.
func (r *Runtime) recordImage(ctx context.Context, name string, target ocispec.Descriptor) (undo func(context.Context) error, _ error) {
	is := r.client.ImageService()
	rec := images.Image{Name: name, Target: target}
	old, err := is.Get(ctx, name)
	switch {
	case errdefs.IsNotFound(err):
		if _, err := is.Create(ctx, rec); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			if err := is.Delete(ctx, name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
			return nil
		}, nil
	case err != nil:
		return nil, err
	}
	if _, err := is.Update(ctx, rec, "target", "labels"); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := is.Update(ctx, old, "target", "labels")
		return err
	}, nil
}

// adoptByDigest records the snapshot's image under its digest too
// (<repository>@<digest>, how forks pin it: `IMAGE@DIGEST` normalizes to
// that), so a fork named so on this node finds it here and pulls nothing.
// The alias is an image record of its own for the cache (its LRU and
// placement); a failure only costs that fork a pull, so it is logged.
func (r *Runtime) adoptByDigest(ctx context.Context, name string, manifest ocispec.Descriptor) {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return
	}
	alias := named.Name() + "@" + manifest.Digest.String()
	if _, err := r.recordImage(ctx, alias, manifest); err != nil {
		r.log.Warn("record a snapshot's image by digest", "image", alias, "err", err)
		return
	}
	if err := r.images.Adopt(ctx, alias); err != nil {
		r.log.Warn("adopt a snapshot's image by digest", "image", alias, "err", err)
	}
}

// pushSnapshot pushes the image to the snapshot registry, reporting the
// bytes sent (the new layer is most of them; blobs the registry has are
// counted as sent).
func (r *Runtime) pushSnapshot(ctx context.Context, name string, manifest, layer ocispec.Descriptor, auth [][]byte, progress func(runtime.SnapshotProgress)) error {
	cs := r.client.ContentStore()
	m, err := images.Manifest(ctx, cs, manifest, nil)
	if err != nil {
		return err
	}
	descs := append([]ocispec.Descriptor{manifest, m.Config}, m.Layers...)
	var total int64
	for _, d := range descs {
		total += d.Size
	}
	tracker := docker.NewInMemoryTracker()
	report := func() {
		var done int64
		for _, d := range descs {
			if st, err := tracker.GetStatus(remotes.MakeRefKey(ctx, d)); err == nil {
				done += min(st.Offset, d.Size)
			}
		}
		progress(runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: done, BytesTotal: total})
	}
	report()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				report()
			}
		}
	})
	err = r.client.Push(ctx, name, manifest, ctrd.WithResolver(r.images.Resolver(ctx, auth, tracker)))
	close(stop)
	wg.Wait()
	if err != nil {
		return pushError(r.cfg.SnapshotRegistry, name, err)
	}
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: total, BytesTotal: total})
	return nil
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

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if now := time.Now(); now.Sub(p.last) >= p.every {
		p.last = now
		p.report(p.n)
	}
	return n, err
}

// countWriter counts what goes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
