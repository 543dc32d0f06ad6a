package noderuntime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
)

// Moving gVisor sandboxes between nodes (runtime.MovedCheckpoint).
//
// A drain of a node with a checkpoint repository moves its gVisor
// sandboxes instead of evicting them: each running one is paused (its
// checkpoint on the node's disk, as Pause makes it), then its checkpoint,
// its writable layer (the snapshot's upper directory) and its daemon's
// assign token are pushed as one OCI artifact to
// <CheckpointRepository>/<namespace>/<pod>:moved-<uid> (two uncompressed
// tar layers, the config MediaTypeCheckpoint), its exit is published with
// ReasonMoved and the artifact, and the slot is released. A bind that
// names the artifact (BindRequest.Restore) on another node fetches it into
// <CheckpointDir>/moved-<slot> and starts as a fork's bind does: the same
// daemon command line (its assign token's hash), the writable layer copied
// into its snapshot, the wrapper's restore marker, and a re-assignment with
// the token the daemon holds. The artifact is deleted from the registry
// once the restored sandbox runs.

// movedConfig is a moved sandbox's artifact config.
type movedConfig struct {
	PodUID    string `json:"pod_uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Image     string `json:"image"`
	AssignKey string `json:"assign_key"`
	// SpecHash is the assign token hash on its daemon's command line.
	SpecHash string    `json:"spec_hash"`
	Node     string    `json:"node"`
	Created  time.Time `json:"created"`
}

// moveTimeout bounds a move's checkpoint and push.
const moveTimeout = 10 * time.Minute

// moveOut moves slot s's sandbox away for a drain: paused if it runs,
// pushed, its exit published as ReasonMoved. The caller releases the slot.
// An error leaves the sandbox as it was (running, or paused here).
func (r *Runtime) moveOut(ctx context.Context, s *slot, why string) (runtime.MovedCheckpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, moveTimeout)
	defer cancel()
	r.mu.Lock()
	if s.Pod == nil || len(s.containers) != 1 {
		r.mu.Unlock()
		return runtime.MovedCheckpoint{}, fmt.Errorf("move: only a pod of one container moves: %w", errdefs.ErrFailedPrecondition)
	}
	pod, state, id := *s.Pod, s.State, s.containers[0]
	r.mu.Unlock()
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: %w", pod.UID, err)
	}
	if !r.isGVisor(ctx, container) {
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: it runs under runc, whose processes cannot be saved (CRIU): %w", pod.UID, errdefs.ErrFailedPrecondition)
	}
	begin := time.Now()
	wasPaused := state == runtime.StatePaused
	if !wasPaused {
		if _, err := r.Pause(ctx, pod.UID); err != nil {
			return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: %w", pod.UID, err)
		}
	}
	r.mu.Lock()
	if s.State != runtime.StatePaused || s.Pod == nil || s.Pod.UID != pod.UID || s.moving {
		r.mu.Unlock()
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: it is no longer paused here (resumed, released, or moving): %w", pod.UID, errdefs.ErrFailedPrecondition)
	}
	// Moved, it stays so until its release (the caller's) resets the
	// slot: a resume in between would run what has moved.
	s.moving = true
	r.mu.Unlock()
	ref, size, err := r.pushMoved(ctx, s, pod, id)
	if err != nil {
		r.mu.Lock()
		s.moving = false
		r.mu.Unlock()
		if !wasPaused {
			// Paused here for the move: it runs on if it can, and the
			// drain evicts it as it would have.
			r.log.Warn("move failed: the sandbox stays paused here", "pod", pod.UID, "err", err)
		}
		r.metrics.checkpoints.WithLabelValues("move", runtime.SnapshotOutcome(err)).Inc()
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: %w", pod.UID, err)
	}
	r.metrics.checkpoints.WithLabelValues("move", "ok").Inc()
	r.metrics.checkpointSeconds.WithLabelValues("move").Observe(time.Since(begin).Seconds())
	moved := runtime.MovedCheckpoint{Ref: ref, Paused: wasPaused, From: r.cfg.Node, Bytes: size}
	r.mu.Lock()
	r.hub.Publish(runtime.Event{Type: runtime.EventExit, Time: r.cfg.Clock.Now(), Slot: s.Slot.Clone(),
		Container: strings.TrimPrefix(id, s.ID+"-"), Reason: runtime.ReasonMoved, Moved: &moved,
		Message: fmt.Sprintf("moved off node %s (%s): its running state (%.1f MiB) waits in %s", r.cfg.Node, why, float64(size)/(1<<20), ref)})
	r.mu.Unlock()
	r.log.Info("moved out", "pod", pod.UID, "ref", ref, "bytes", size, "paused", wasPaused, "took", time.Since(begin))
	return moved, nil
}

// Move implements runtime.Mover.
func (r *Runtime) Move(ctx context.Context, uid string) (runtime.MovedCheckpoint, error) {
	ctx = r.nsCtx(ctx)
	r.mu.Lock()
	s, ok := r.byPod[uid]
	var state runtime.SlotState
	if ok {
		state = s.State
	}
	r.mu.Unlock()
	switch {
	case !ok:
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case r.cfg.CheckpointRepository == "":
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: node %s has no checkpoint repository (sandman-node --checkpoint-repository): %w", uid, r.cfg.Node, errdefs.ErrFailedPrecondition)
	case state != runtime.StateBound && state != runtime.StatePaused:
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: the pod is %s: %w", uid, state, errdefs.ErrFailedPrecondition)
	}
	moved, err := r.moveOut(context.WithoutCancel(ctx), s, "asked to move it")
	if err != nil {
		return runtime.MovedCheckpoint{}, err
	}
	if err := r.Release(ctx, uid, 0); err != nil {
		return moved, fmt.Errorf("move %s: release its slot: %w", uid, err)
	}
	return moved, nil
}

// pushMoved pushes paused slot s's checkpoint, writable layer and assign
// token; it returns the artifact's name by digest and its size.
func (r *Runtime) pushMoved(ctx context.Context, s *slot, pod runtime.PodRef, id string) (string, int64, error) {
	key, err := os.ReadFile(filepath.Join(s.dir, assignKeyFile))
	if err != nil {
		return "", 0, fmt.Errorf("its daemon's assign token is not kept (%v): a sandbox started by an older agent cannot move: %w", err, errdefs.ErrFailedPrecondition)
	}
	upper, err := r.upperOf(ctx, id)
	if err != nil {
		return "", 0, err
	}
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return "", 0, err
	}
	specHash, err := specAssignHash(ctx, container)
	if err != nil {
		return "", 0, err
	}
	auth, err := r.snapshotPushAuth()
	if err != nil {
		return "", 0, err
	}
	name := r.cfg.CheckpointRepository + "/" + pod.Namespace + "/" + pod.Name + ":moved-" + pod.UID
	pusher, err := r.images.Resolver(ctx, auth, nil).Pusher(ctx, name)
	if err != nil {
		return "", 0, pushError(r.cfg.CheckpointRepository, name, err)
	}
	// Each layer is packed into a file beside the checkpoint (its digest
	// must be known before its upload), then sent from there.
	begin := time.Now()
	var layers []ocispec.Descriptor
	var sent time.Duration
	for _, l := range []struct{ dir, title string }{{r.checkpointDir(s), "checkpoint"}, {upper, "files"}} {
		spool := filepath.Join(r.cfg.CheckpointDir, "push-"+s.ID+"-"+l.title+".tar")
		desc, err := tarFile(ctx, l.dir, spool)
		if err != nil {
			_ = os.Remove(spool)
			if diskFull(err) {
				return "", 0, fmt.Errorf("pack its %s: the node's disk is full: %w", l.title, errdefs.ErrResourceExhausted)
			}
			return "", 0, fmt.Errorf("pack its %s: %w", l.title, err)
		}
		desc.Annotations = map[string]string{ocispec.AnnotationTitle: l.title}
		t := time.Now()
		err = pushFile(ctx, pusher, desc, spool)
		sent += time.Since(t)
		_ = os.Remove(spool)
		if err != nil {
			return "", 0, pushError(r.cfg.CheckpointRepository, name, err)
		}
		layers = append(layers, desc)
	}
	r.mu.Lock()
	image := s.Image
	r.mu.Unlock()
	cfg, _ := json.Marshal(movedConfig{PodUID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Image: image,
		AssignKey: strings.TrimSpace(string(key)), SpecHash: specHash, Node: r.cfg.Node, Created: time.Now().UTC()})
	cfgDesc := ocispec.Descriptor{MediaType: runtime.MediaTypeCheckpoint, Digest: digest.FromBytes(cfg), Size: int64(len(cfg))}
	if err := pushBytes(ctx, pusher, cfgDesc, cfg); err != nil {
		return "", 0, pushError(r.cfg.CheckpointRepository, name, err)
	}
	b, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cfgDesc, Layers: layers})
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := pushBytes(ctx, pusher, desc, b); err != nil {
		return "", 0, pushError(r.cfg.CheckpointRepository, name, err)
	}
	r.log.Info("moved sandbox pushed", "pod", pod.UID, "pack", time.Since(begin)-sent, "push", sent)
	repo, _, _ := strings.Cut(name, ":moved-")
	return repo + "@" + desc.Digest.String(), layers[0].Size + layers[1].Size, nil
}

// tarFile writes dir's contents to file as an uncompressed tar (owners by
// number, modes, extended attributes, devices: overlay's whiteouts and
// opaque marks) and describes it as a layer.
func tarFile(ctx context.Context, dir, file string) (ocispec.Descriptor, error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", dir, "-cf", "-", ".")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return ocispec.Descriptor{}, err
	}
	d := digest.SHA256.Digester()
	n, err := io.CopyBuffer(io.MultiWriter(f, d.Hash()), out, make([]byte, 1<<20))
	if werr := cmd.Wait(); werr != nil && err == nil {
		err = fmt.Errorf("tar: %v: %s", werr, strings.TrimSpace(stderr.String()))
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: d.Digest(), Size: n}, nil
}

// pushFile uploads file as blob desc (nothing when the registry has it).
func pushFile(ctx context.Context, p remotes.Pusher, desc ocispec.Descriptor, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return nodeimage.PushBlob(ctx, p, desc, f)
}

func pushBytes(ctx context.Context, p remotes.Pusher, desc ocispec.Descriptor, b []byte) error {
	return nodeimage.PushBlob(ctx, p, desc, bytes.NewReader(b))
}

// checkMovedRef refuses a moved sandbox's artifact that this node would
// not have pushed for pod: one not <CheckpointRepository>/<namespace>/<pod>,
// by digest (runtime.CheckMovedRef, and the repository).
func (r *Runtime) checkMovedRef(ref string, pod runtime.PodRef) error {
	if r.cfg.CheckpointRepository == "" {
		return fmt.Errorf("node %s has no checkpoint repository (sandman-node --checkpoint-repository): it cannot restore moved sandboxes: %w", r.cfg.Node, errdefs.ErrFailedPrecondition)
	}
	if err := runtime.CheckMovedRef(ref, pod); err != nil {
		return fmt.Errorf("moved sandbox: %w", err)
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return fmt.Errorf("moved sandbox %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	want := r.cfg.CheckpointRepository + "/" + pod.Namespace + "/" + pod.Name
	if _, ok := named.(reference.Canonical); !ok || named.Name() != want {
		return fmt.Errorf("moved sandbox %q: not an artifact %s@sha256:…: %w", ref, want, errdefs.ErrInvalidArgument)
	}
	return nil
}

// of refuses a moved sandbox's config that is not pod's: another UID (a
// pod of the same name before this one), or another namespace or name.
func (c movedConfig) of(pod runtime.PodRef) error {
	switch {
	case c.PodUID != pod.UID:
		return fmt.Errorf("it is pod %s's checkpoint, not %s's: %w", c.PodUID, pod.UID, errdefs.ErrInvalidArgument)
	case c.Namespace != pod.Namespace || c.Name != pod.Name:
		return fmt.Errorf("it is pod %s/%s's checkpoint, not %s/%s's: %w", c.Namespace, c.Name, pod.Namespace, pod.Name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// readMoved resolves a moved sandbox's artifact and reads its manifest and
// config, each checked against its digest. An artifact that is gone is
// ErrNotFound.
func (r *Runtime) readMoved(ctx context.Context, ref string) (remotes.Fetcher, ocispec.Manifest, movedConfig, error) {
	auth, err := r.snapshotPushAuth()
	if err != nil {
		return nil, ocispec.Manifest{}, movedConfig{}, err
	}
	resolver := r.images.Resolver(ctx, auth, nil)
	name, target, err := resolver.Resolve(ctx, ref)
	if err != nil {
		return nil, ocispec.Manifest{}, movedConfig{}, fmt.Errorf("fetch checkpoint %s: %w", ref, err)
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return nil, ocispec.Manifest{}, movedConfig{}, fetchMovedError(ref, err)
	}
	raw, err := fetchSmall(ctx, fetcher, target)
	if err != nil {
		return nil, ocispec.Manifest{}, movedConfig{}, fetchMovedError(ref, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil || m.Config.MediaType != runtime.MediaTypeCheckpoint || len(m.Layers) != 2 {
		return nil, ocispec.Manifest{}, movedConfig{}, fmt.Errorf("%s is not a moved sandbox's checkpoint: %w", ref, errdefs.ErrDataLoss)
	}
	rawCfg, err := fetchSmall(ctx, fetcher, m.Config)
	if err != nil {
		return nil, ocispec.Manifest{}, movedConfig{}, fetchMovedError(ref, err)
	}
	var cfg movedConfig
	if err := json.Unmarshal(rawCfg, &cfg); err != nil {
		return nil, ocispec.Manifest{}, movedConfig{}, fmt.Errorf("%s: its config: %v: %w", ref, err, errdefs.ErrDataLoss)
	}
	return fetcher, m, cfg, nil
}

// fetchMovedError says which checkpoint a fetch after its resolve failed
// for; it is no longer ErrNotFound (the artifact resolved).
func fetchMovedError(ref string, err error) error {
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("fetch checkpoint %s: %v: %w", ref, err, errdefs.ErrDataLoss)
	}
	return fmt.Errorf("fetch checkpoint %s: %w", ref, err)
}

// fetchMoved fetches a bind's moved sandbox (req.Restore) into a directory
// laid out as a fork's image (ckpt/, upper/), which the bind removes once
// its sandbox started (releaseFork).
func (r *Runtime) fetchMoved(ctx context.Context, s *slot, req runtime.BindRequest) (_ *forkImage, retErr error) {
	ref := req.Restore.Ref
	if err := r.checkMovedRef(ref, req.Pod); err != nil {
		return nil, err
	}
	begin := time.Now()
	fetcher, m, cfg, err := r.readMoved(ctx, ref)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("its checkpoint %s is gone: %w", ref, errdefs.ErrDataLoss)
	}
	if err != nil {
		return nil, err
	}
	if err := cfg.of(req.Pod); err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	switch {
	case cfg.SpecHash == "" || cfg.AssignKey == "":
		return nil, fmt.Errorf("%s names no assign token: %w", ref, errdefs.ErrDataLoss)
	case cfg.Image != req.Containers[0].Image:
		return nil, fmt.Errorf("%s ran image %s, not %s: %w", ref, cfg.Image, req.Containers[0].Image, errdefs.ErrInvalidArgument)
	}
	fi := &forkImage{key: "moved/" + req.Pod.UID, source: req.Pod.UID, assignKey: cfg.AssignKey, specHash: cfg.SpecHash, made: time.Now(),
		dir: filepath.Join(r.cfg.CheckpointDir, "moved-"+s.ID), uses: 1, dropped: true, done: make(chan struct{})}
	close(fi.done)
	defer func() {
		if retErr != nil {
			r.releaseFork(fi)
		}
	}()
	if err := os.MkdirAll(r.cfg.CheckpointDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(fi.dir); err != nil {
		return nil, err
	}
	for i, dst := range []string{fi.ckpt(), fi.upper()} {
		if err := os.MkdirAll(dst, 0o700); err != nil {
			return nil, err
		}
		if err := untarFetched(ctx, fetcher, m.Layers[i], dst); err != nil {
			if diskFull(err) {
				return nil, fmt.Errorf("unpack its checkpoint: the node's disk is full: %w", errdefs.ErrResourceExhausted)
			}
			return nil, fmt.Errorf("unpack its checkpoint: %v: %w", err, errdefs.ErrDataLoss)
		}
	}
	r.log.Info("moved sandbox fetched", "pod", req.Pod.UID, "took", time.Since(begin))
	return fi, nil
}

// fetchSmall reads a small blob (a manifest, a config), checking its
// digest.
func fetchSmall(ctx context.Context, f remotes.Fetcher, desc ocispec.Descriptor) ([]byte, error) {
	if desc.Size > 1<<20 {
		return nil, fmt.Errorf("blob %s: %d bytes, too large: %w", desc.Digest, desc.Size, errdefs.ErrDataLoss)
	}
	rc, err := f.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, desc.Size+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != desc.Size || digest.FromBytes(b) != desc.Digest {
		return nil, fmt.Errorf("blob %s does not match its digest: %w", desc.Digest, errdefs.ErrDataLoss)
	}
	return b, nil
}

// untarFetched streams a tar layer from the registry into dst with owners,
// modes and extended attributes as they were, checking its digest and
// size.
func untarFetched(ctx context.Context, f remotes.Fetcher, desc ocispec.Descriptor, dst string) error {
	rc, err := f.Fetch(ctx, desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	v := desc.Digest.Verifier()
	in := &countWriter{w: v}
	cmd := exec.CommandContext(ctx, "tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "--same-owner", "-p", "-C", dst, "-xf", "-")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	_, cerr := io.CopyBuffer(io.MultiWriter(stdin, in), rc, make([]byte, 1<<20))
	_ = stdin.Close()
	werr := cmd.Wait()
	switch {
	case werr != nil:
		return errors.New(runscMessage([]byte(out.String()), werr))
	case cerr != nil:
		return cerr
	case in.n != desc.Size || !v.Verified():
		return fmt.Errorf("layer %s does not match its digest", desc.Digest)
	}
	return nil
}

// DeleteCheckpoint implements runtime.CheckpointStore: pod's moved
// sandbox's artifact, in the node's checkpoint repository under the pod's
// namespace and name (checkMovedRef) and whose config names the pod's UID,
// is deleted from the registry. One already gone is not an error.
func (r *Runtime) DeleteCheckpoint(ctx context.Context, pod runtime.PodRef, ref string) error {
	if err := r.checkMovedRef(ref, pod); err != nil {
		return err
	}
	_, _, cfg, err := r.readMoved(ctx, ref)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := cfg.of(pod); err != nil {
		return fmt.Errorf("delete %s: %w", ref, err)
	}
	auth, err := r.snapshotPushAuth()
	if err != nil {
		return err
	}
	return r.images.DeleteManifest(ctx, ref, auth)
}
