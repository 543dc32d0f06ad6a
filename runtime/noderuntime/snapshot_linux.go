package noderuntime

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// Snapshots (runtime.Snapshotter). A snapshot takes what one
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

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if now := time.Now(); now.Sub(p.last) >= p.every {
		p.last = now
		p.report(p.n)
	}
	return n, err
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
