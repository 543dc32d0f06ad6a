package noderuntime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// Live forks (runtime.ForkSource) of gVisor sandboxes.
//
// The first bind of a fork (a source pod and a fork ID) stops the source's
// tasks (runsc pause), checkpoints it leaving it running (runsc checkpoint
// --leave-running) into <CheckpointDir>/fork-<slot>-<id>/ckpt, copies its
// writable layer (the snapshot's upper directory, which gVisor writes with
// --overlay2=none) into upper/ beside it, and lets it run again: the two
// are of one moment. Every bind of the fork then makes its container as any
// bind does, copies upper/ into its own snapshot's upper directory and
// starts it as a resume does, the wrapper turning the shim's start into a
// runsc restore of ckpt. The restored daemon still holds the source's
// tokens and assign token; the agent re-assigns it (POST /v1/assign,
// reassign) with the source's assign token, which every slot keeps once
// its daemon is assigned (assignKeyFile), to the fork's own tokens.
//
// A fork image is removed when its source is released or paused, when a
// fork of a new ID of the same source is made, once runtime.ForkKeep
// passed (checked at each fork), and by a restarted agent (every
// checkpoint directory not of a paused slot).

// forkImage is one fork's checkpoint and writable layer.
type forkImage struct {
	key, source, dir string
	// assignKey is the source daemon's assign token when it was
	// checkpointed: its forks' daemons hold its hash. specHash is the hash
	// on the source daemon's command line (its first assign token's: a
	// sandbox restored before keeps the one it started with), which a
	// restore's spec must repeat.
	assignKey, specHash string
	made                time.Time
	// done is closed once the checkpoint is made (err says whether).
	done chan struct{}
	err  error
	// uses counts binds reading dir; dropped: remove it after the last.
	uses    int
	dropped bool
}

func (f *forkImage) ckpt() string  { return filepath.Join(f.dir, "ckpt") }
func (f *forkImage) upper() string { return filepath.Join(f.dir, "upper") }

// acquireFork returns the checkpoint of req's fork, taking it if it is the
// fork's first bind, and counts the bind as its user: releaseFork after
// the fork's sandbox started.
func (r *Runtime) acquireFork(ctx context.Context, req runtime.BindRequest) (*forkImage, error) {
	f := req.Fork
	key := f.PodUID + "/" + f.ID
	now := time.Now()
	var drop []*forkImage
	r.mu.Lock()
	if r.forks == nil {
		r.forks = map[string]*forkImage{}
	}
	for k, o := range r.forks {
		if k != key && (o.source == f.PodUID || now.Sub(o.made) > runtime.ForkKeep) {
			delete(r.forks, k)
			drop = append(drop, o)
		}
	}
	fi := r.forks[key]
	first := fi == nil
	if first {
		fi = &forkImage{key: key, source: f.PodUID, made: now, done: make(chan struct{})}
		r.forks[key] = fi
	}
	fi.uses++
	r.mu.Unlock()
	r.dropForks(drop)
	if first {
		fi.err = r.checkpointFork(ctx, fi, req)
		if fi.err != nil {
			r.mu.Lock()
			if r.forks[fi.key] == fi {
				delete(r.forks, fi.key)
			}
			r.mu.Unlock()
			r.dropForks([]*forkImage{fi})
		}
		close(fi.done)
	} else {
		select {
		case <-fi.done:
		case <-ctx.Done():
			r.releaseFork(fi)
			return nil, ctx.Err()
		}
	}
	if fi.err != nil {
		r.releaseFork(fi)
		return nil, fi.err
	}
	return fi, nil
}

// releaseFork ends a bind's use of fi; the last use of a dropped fork
// image removes it.
func (r *Runtime) releaseFork(fi *forkImage) {
	r.mu.Lock()
	fi.uses--
	remove := fi.dropped && fi.uses == 0
	r.mu.Unlock()
	if remove && fi.dir != "" {
		if err := os.RemoveAll(fi.dir); err != nil {
			r.log.Warn("remove a fork's checkpoint", "dir", fi.dir, "err", err)
		}
	}
}

// dropForks marks fork images for removal (taken out of r.forks already):
// now if no bind reads them, else after the last.
func (r *Runtime) dropForks(list []*forkImage) {
	for _, fi := range list {
		r.mu.Lock()
		fi.dropped, fi.uses = true, fi.uses+1
		r.mu.Unlock()
		r.releaseFork(fi)
	}
}

// dropForksOf drops the fork images of source pod uid (released, paused).
func (r *Runtime) dropForksOf(uid string) {
	var drop []*forkImage
	r.mu.Lock()
	for k, fi := range r.forks {
		if fi.source == uid {
			delete(r.forks, k)
			drop = append(drop, fi)
		}
	}
	r.mu.Unlock()
	r.dropForks(drop)
}

// checkpointFork checkpoints fi's source, leaving it running, and copies its
// writable layer, both while its tasks are stopped.
func (r *Runtime) checkpointFork(ctx context.Context, fi *forkImage, req runtime.BindRequest) (retErr error) {
	begin := time.Now()
	uid := req.Fork.PodUID
	r.mu.Lock()
	s, ok := r.byPod[uid]
	var msg string
	switch {
	case !ok:
		msg = fmt.Sprintf("its source pod %s is not on node %s (a fork starts on its source's node)", uid, r.cfg.Node)
	case s.State != runtime.StateBound || s.pausing || !s.Ready:
		state := string(s.State)
		if s.pausing {
			state = "pausing"
		} else if s.State == runtime.StateBound {
			state = "not ready"
		}
		msg = fmt.Sprintf("its source pod %s is %s: only a running, ready sandbox forks", uid, state)
	case len(s.containers) != 1:
		msg = fmt.Sprintf("its source pod %s has %d containers; only a pod of one container forks", uid, len(s.containers))
	case s.Image != req.Containers[0].Image:
		r.mu.Unlock()
		return fmt.Errorf("fork of %s: the fork runs its source's image %s, not %s: %w", uid, s.Image, req.Containers[0].Image, errdefs.ErrInvalidArgument)
	}
	if msg != "" {
		r.mu.Unlock()
		return fmt.Errorf("fork of %s: %s: %w", uid, msg, errdefs.ErrFailedPrecondition)
	}
	s.forking++
	id, slotDir := s.containers[0], s.dir
	fi.dir = filepath.Join(r.cfg.CheckpointDir, "fork-"+s.ID+"-"+req.Fork.ID)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		s.forking--
		r.mu.Unlock()
		r.metrics.checkpoints.WithLabelValues("fork", runtime.SnapshotOutcome(retErr)).Inc()
		if retErr == nil {
			r.metrics.checkpointSeconds.WithLabelValues("fork").Observe(time.Since(begin).Seconds())
		}
	}()
	key, err := os.ReadFile(filepath.Join(slotDir, assignKeyFile))
	if err != nil {
		return fmt.Errorf("fork of %s: its daemon's assign token is not kept (%v): a sandbox started by an older agent cannot be forked: %w", uid, err, errdefs.ErrFailedPrecondition)
	}
	fi.assignKey = strings.TrimSpace(string(key))
	// runsc, stopped midway, would leave the source stopped.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(r.nsCtx(ctx)), checkpointTimeout)
	defer cancel()
	container, err := r.client.LoadContainer(cctx, id)
	if err != nil {
		return fmt.Errorf("fork of %s: %w", uid, err)
	}
	if fi.specHash, err = specAssignHash(cctx, container); err != nil {
		return fmt.Errorf("fork of %s: %w", uid, err)
	}
	if !r.isGVisor(cctx, container) {
		return fmt.Errorf("fork of %s: the source runs under runc: only gVisor sandboxes (RuntimeClass handler runsc) fork with their processes and memory; a runc sandbox's would need CRIU, which this node does not have: %w", uid, errdefs.ErrFailedPrecondition)
	}
	upper, err := r.upperOf(cctx, container.ID())
	if err != nil {
		return fmt.Errorf("fork of %s: %w", uid, err)
	}
	task, err := container.Task(cctx, nil)
	if err != nil {
		return fmt.Errorf("fork of %s: its task: %w", uid, err)
	}
	if err := os.MkdirAll(r.cfg.CheckpointDir, 0o700); err != nil {
		return fmt.Errorf("fork of %s: %w", uid, err)
	}
	if err := os.RemoveAll(fi.dir); err != nil {
		return fmt.Errorf("fork of %s: %w", uid, err)
	}
	if err := os.Mkdir(fi.dir, 0o700); err != nil {
		return fmt.Errorf("fork of %s: %w", uid, err)
	}
	if err := task.Pause(cctx); err != nil {
		return fmt.Errorf("fork of %s: stop the source's tasks: %w", uid, err)
	}
	stopped := time.Now()
	out, err := exec.CommandContext(cctx, r.runscWrapper(), "--root", filepath.Join(runcRoot, r.cfg.Namespace),
		"checkpoint", "--leave-running", "--compression=none", "--image-path", fi.ckpt(), id).CombinedOutput()
	if err == nil {
		out, err = copyTree(cctx, upper, fi.upper())
	}
	rerr := task.Resume(context.WithoutCancel(cctx))
	frozen := time.Since(stopped)
	if rerr != nil {
		r.log.Error("fork: the source could not be let run again", "pod", uid, "err", rerr)
	}
	if err != nil {
		if diskFull(errors.New(string(out))) {
			return fmt.Errorf("fork of %s: the node's disk is full (no space left on device in %s): %w", uid, r.cfg.CheckpointDir, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("fork of %s: checkpoint: %s", uid, runscMessage(out, err))
	}
	r.log.Info("fork checkpoint", "source", uid, "fork", req.Fork.ID, "bytes", dirSize(fi.dir), "frozen", frozen, "took", time.Since(begin))
	return nil
}

// startFork readies container id of a fork's bind to start from fi: its
// snapshot gets the source's writable layer, and the wrapper restores the
// checkpoint at the shim's start. The returned func removes the marker.
func (r *Runtime) startFork(ctx context.Context, fi *forkImage, id string) (func(), error) {
	upper, err := r.upperOf(ctx, id)
	if err != nil {
		return nil, err
	}
	if out, err := copyTree(ctx, fi.upper(), upper); err != nil {
		if diskFull(errors.New(string(out))) {
			return nil, fmt.Errorf("copy the source's files: the node's disk is full: %w", errdefs.ErrResourceExhausted)
		}
		return nil, fmt.Errorf("copy the source's files: %s", runscMessage(out, err))
	}
	marker := filepath.Join(r.restoreDir(), id)
	if err := os.WriteFile(marker, []byte(fi.ckpt()), 0o600); err != nil {
		return nil, err
	}
	return func() { _ = os.Remove(marker) }, nil
}

// specAssignHash is the assign token hash on a container's daemon command
// line (--assign-token-sha256).
func specAssignHash(ctx context.Context, c ctrd.Container) (string, error) {
	spec, err := c.Spec(ctx)
	if err != nil {
		return "", err
	}
	if spec.Process != nil {
		args := spec.Process.Args
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "--assign-token-sha256" {
				return args[i+1], nil
			}
		}
	}
	return "", fmt.Errorf("container %s: its daemon's command line names no assign token: %w", c.ID(), errdefs.ErrFailedPrecondition)
}

// upperOf is the upper directory of container id's snapshot.
func (r *Runtime) upperOf(ctx context.Context, id string) (string, error) {
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return "", err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return "", err
	}
	mounts, err := r.client.SnapshotService(r.cfg.Snapshotter).Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", info.SnapshotKey, err)
	}
	return upperDir(mounts)
}

// copyTree copies directory src's contents into dst (made if missing) with
// owners, modes, times, extended attributes (overlay's opaque marks),
// devices (its whiteouts) and hard links kept; sharing blocks where the
// filesystem can.
func copyTree(ctx context.Context, src, dst string) ([]byte, error) {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, err
	}
	return exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src+"/.", dst+"/").CombinedOutput()
}

// checkForkMemory refuses a fork whose memory limit is below what its
// source uses now: restored, its processes would hold that much at once,
// and the kernel would kill them. A source whose use cannot be read is
// left to the checkpoint's own checks.
func (r *Runtime) checkForkMemory(ctx context.Context, req runtime.BindRequest) error {
	limit := req.Containers[0].Limits.MemoryBytes
	if limit <= 0 {
		return nil
	}
	st, err := r.Stats(ctx, req.Fork.PodUID)
	if err != nil || st.MemoryBytes <= uint64(limit) {
		return nil
	}
	return fmt.Errorf("fork of %s: its memory limit, %d MiB, is below the %d MiB its source uses: restored, it would run out at once; give the fork its source's limit: %w",
		req.Fork.PodUID, limit>>20, st.MemoryBytes>>20, errdefs.ErrInvalidArgument)
}
