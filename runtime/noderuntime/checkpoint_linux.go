package noderuntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// Pause and resume (runtime.Checkpointer) of gVisor sandboxes.
//
// Pause stops the sandbox's tasks (containerd's Pause: runsc pause) and
// runs `runsc checkpoint --leave-running` (through the wrapper, so with the
// node's runsc flags) on the pod's container: the Sentry writes the
// sandbox's whole state — its processes, memory, open files, listening
// sockets — to <CheckpointDir>/<slot>, uncompressed; then the stopped
// sandbox's Sentry is killed. A checkpoint that fails lets it run again. The task is deleted; the
// container and its snapshot (the sandbox's filesystem, which gVisor keeps
// in the snapshot's upper directory, --overlay2=none) stay, and so does the
// slot with its network namespace and address. A marker, <slot>/paused.json,
// lets a restarted agent re-adopt the paused slot.
//
// Resume creates the container's task again; the wrapper turns the shim's
// start into `runsc restore --background` of the checkpoint, which returns
// once the sandbox runs while its memory is still being read in. The
// sandbox's listening sockets are made again in the same namespace, at the
// same address; connections open at the pause are reset. The checkpoint is
// removed once the sandbox runs (the Sentry holds the files it still
// reads).

// runcRoot is where containerd's runc shim keeps its runtime's state, by
// namespace (the shim's default: sandman sets no root of its own).
const runcRoot = "/run/containerd/runc"

// checkpointTimeout bounds runsc's checkpoint and the task's end after it.
const checkpointTimeout = 5 * time.Minute

// restoreDir holds the wrapper's markers: a file per container being
// resumed, holding its checkpoint's path.
func (r *Runtime) restoreDir() string { return filepath.Join(r.cfg.StateDir, "runsc", "restore") }

// checkpointDir is where a slot's checkpoint goes.
func (r *Runtime) checkpointDir(s *slot) string { return filepath.Join(r.cfg.CheckpointDir, s.ID) }

func pausedFile(slotDir string) string { return filepath.Join(slotDir, "paused.json") }

// pausedMeta is a paused slot's marker.
type pausedMeta struct {
	PodUID string `json:"pod_uid"`
	Bytes  int64  `json:"bytes"`
}

// removeCheckpoint removes a slot's checkpoint and its paused marker.
func (r *Runtime) removeCheckpoint(s *slot) error {
	err := os.Remove(pausedFile(s.dir))
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, os.RemoveAll(r.checkpointDir(s)))
}

// Pause implements runtime.Checkpointer.
func (r *Runtime) Pause(ctx context.Context, uid string) (_ runtime.PauseResult, retErr error) {
	ctx = r.nsCtx(ctx)
	begin := time.Now()
	r.mu.Lock()
	s, ok := r.byPod[uid]
	switch {
	case !ok:
		r.mu.Unlock()
		return runtime.PauseResult{}, fmt.Errorf("pause %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case s.State == runtime.StatePaused:
		n := s.checkpointBytes
		r.mu.Unlock()
		return runtime.PauseResult{Bytes: n}, nil
	case s.State != runtime.StateBound || s.pausing || s.snapshots > 0 || s.forking > 0:
		state := s.State
		switch {
		case s.pausing:
			state = "pausing"
		case s.snapshots > 0:
			state = "being snapshotted"
		case s.forking > 0:
			state = "being forked"
		}
		r.mu.Unlock()
		return runtime.PauseResult{}, fmt.Errorf("pause %s: the pod is %s: %w", uid, state, errdefs.ErrFailedPrecondition)
	case len(s.containers) != 1:
		n := len(s.containers)
		r.mu.Unlock()
		return runtime.PauseResult{}, fmt.Errorf("pause %s: the pod has %d containers; only a pod of one container can be paused: %w", uid, n, errdefs.ErrFailedPrecondition)
	}
	id := s.containers[0]
	s.pausing = true
	r.mu.Unlock()
	// Its forks' checkpoints are of a sandbox that stops now.
	r.dropForksOf(uid)
	defer func() {
		r.metrics.checkpoints.WithLabelValues("pause", runtime.SnapshotOutcome(retErr)).Inc()
		if retErr == nil {
			r.metrics.checkpointSeconds.WithLabelValues("pause").Observe(time.Since(begin).Seconds())
			return
		}
		r.log.Warn("pause failed", "pod", uid, "slot", s.ID, "err", retErr)
		// The sandbox runs on; an exit meanwhile was a real one.
		r.mu.Lock()
		s.pausing = false
		exits := s.pauseExits
		s.pauseExits = nil
		for _, ev := range exits {
			ev.Slot = s.Slot.Clone()
			r.hub.Publish(ev)
		}
		r.mu.Unlock()
	}()

	// The checkpoint is not cut short by the caller: runsc, stopped
	// midway, would leave the sandbox's state unknown.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointTimeout)
	defer cancel()
	container, err := r.client.LoadContainer(cctx, id)
	if err != nil {
		return runtime.PauseResult{}, fmt.Errorf("pause %s: %w", uid, err)
	}
	if !r.isGVisor(cctx, container) {
		return runtime.PauseResult{}, fmt.Errorf("pause %s: the pod runs under runc: only gVisor sandboxes (RuntimeClass handler runsc) keep their processes and memory; a runc sandbox's would need CRIU, which this node does not have: %w", uid, errdefs.ErrFailedPrecondition)
	}
	task, err := container.Task(cctx, nil)
	if err != nil {
		return runtime.PauseResult{}, fmt.Errorf("pause %s: its task: %w", uid, err)
	}
	exit, err := task.Wait(cctx)
	if err != nil {
		return runtime.PauseResult{}, fmt.Errorf("pause %s: %w", uid, err)
	}
	dir := r.checkpointDir(s)
	if err := r.removeCheckpoint(s); err != nil {
		return runtime.PauseResult{}, fmt.Errorf("pause %s: remove an old checkpoint: %w", uid, err)
	}
	// A checkpoint is the sandbox's memory: root's alone.
	if err := os.MkdirAll(r.cfg.CheckpointDir, 0o700); err != nil {
		return runtime.PauseResult{}, fmt.Errorf("pause %s: %w", uid, err)
	}
	// The sandbox is stopped first (runsc pause: its tasks stop, the
	// Sentry runs) and checkpointed leaving it so: a checkpoint that fails
	// leaves it to run on, and one that succeeds leaves it stopped at the
	// moment its state was written, until it is killed.
	if err := task.Pause(cctx); err != nil {
		return runtime.PauseResult{}, fmt.Errorf("pause %s: stop the sandbox's tasks: %w", uid, err)
	}
	out, err := exec.CommandContext(cctx, r.runscWrapper(), "--root", filepath.Join(runcRoot, r.cfg.Namespace),
		"checkpoint", "--leave-running", "--compression=none", "--image-path", dir, id).CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		if rerr := task.Resume(context.WithoutCancel(cctx)); rerr != nil {
			r.log.Error("pause failed and the sandbox could not be let run again", "pod", uid, "err", rerr)
		}
		if diskFull(errors.New(string(out))) {
			return runtime.PauseResult{}, fmt.Errorf("pause %s: the node's disk is full (no space left on device in %s): %w", uid, r.cfg.CheckpointDir, errdefs.ErrResourceExhausted)
		}
		msg := runscMessage(out, err)
		return runtime.PauseResult{}, fmt.Errorf("pause %s: runsc checkpoint: %s", uid, msg)
	}
	// The Sentry (the task's process on the node) is killed while the
	// sandbox's tasks are stopped: nothing runs after its state was
	// written. (A kill through runsc is not delivered to stopped tasks.)
	if pid := task.Pid(); pid > 0 {
		_ = syscall.Kill(int(pid), syscall.SIGKILL)
	}
	select {
	case <-exit:
	case <-cctx.Done():
		return runtime.PauseResult{}, fmt.Errorf("pause %s: the checkpointed sandbox did not end: %w", uid, cctx.Err())
	}
	// runsc still has the container as paused, which the shim's delete
	// refuses without force: it is removed first.
	r.forceDeleteRunsc(cctx, id)
	if _, err := task.Delete(cctx); err != nil && !errdefs.IsNotFound(err) {
		// The sandbox is gone, its checkpoint kept: the pause stands.
		r.log.Warn("pause: delete the checkpointed task", "pod", uid, "err", err)
	}
	size := dirSize(dir)
	b, _ := json.Marshal(pausedMeta{PodUID: uid, Bytes: size})
	if err := os.WriteFile(pausedFile(s.dir), b, 0o600); err != nil {
		r.log.Warn("pause: write the paused marker", "pod", uid, "err", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s.epoch++
	s.pausing, s.pauseExits = false, nil
	if s.stopReady != nil {
		s.stopReady()
	}
	s.Ready, s.checkpointBytes = false, size
	r.setLocked(s, runtime.StatePaused)
	r.log.Info("paused", "pod", uid, "slot", s.ID, "bytes", size, "took", time.Since(begin))
	return runtime.PauseResult{Bytes: size}, nil
}

// Resume implements runtime.Checkpointer.
func (r *Runtime) Resume(ctx context.Context, uid string) (retErr error) {
	ctx = r.nsCtx(ctx)
	begin := time.Now()
	r.mu.Lock()
	s, ok := r.byPod[uid]
	switch {
	case !ok:
		r.mu.Unlock()
		return fmt.Errorf("resume %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case s.State == runtime.StateBound && !s.pausing:
		r.mu.Unlock()
		return nil
	case s.State != runtime.StatePaused:
		state := s.State
		r.mu.Unlock()
		return fmt.Errorf("resume %s: the pod is %s, not paused: %w", uid, state, errdefs.ErrFailedPrecondition)
	case r.draining != "":
		msg := r.draining
		r.mu.Unlock()
		return fmt.Errorf("resume %s: %s: %w", uid, msg, errdefs.ErrUnavailable)
	case s.moving:
		r.mu.Unlock()
		return fmt.Errorf("resume %s: it is being moved off node %s: %w", uid, r.cfg.Node, errdefs.ErrUnavailable)
	}
	var used runtime.Resources
	for _, o := range r.slots {
		if o.State == runtime.StateBinding || o.State == runtime.StateBound || o.State == runtime.StateReleasing {
			used = used.Add(o.Resources)
		}
	}
	if total := used.Add(s.Resources); total.MilliCPU > r.cfg.Resources.MilliCPU || total.MemoryBytes > r.cfg.Resources.MemoryBytes {
		r.mu.Unlock()
		return fmt.Errorf("resume %s: requests of %dm CPU and %d bytes do not fit on %s: %w", uid, s.Resources.MilliCPU, s.Resources.MemoryBytes, r.cfg.Node, errdefs.ErrResourceExhausted)
	}
	id := s.containers[0]
	r.setLocked(s, runtime.StateBinding) // a release waits; the requests count
	r.mu.Unlock()
	defer func() {
		r.metrics.checkpoints.WithLabelValues("resume", runtime.SnapshotOutcome(retErr)).Inc()
		r.mu.Lock()
		defer r.mu.Unlock()
		if retErr != nil {
			r.log.Warn("resume failed", "pod", uid, "slot", s.ID, "err", retErr)
			s.earlyExits = nil
			r.setLocked(s, runtime.StatePaused)
			return
		}
		r.metrics.checkpointSeconds.WithLabelValues("resume").Observe(time.Since(begin).Seconds())
		s.checkpointBytes = 0
		r.setLocked(s, runtime.StateBound)
		for _, ev := range s.earlyExits {
			ev.Slot = s.Slot.Clone()
			r.hub.Publish(ev)
		}
		s.earlyExits = nil
		r.log.Info("resumed", "pod", uid, "slot", s.ID, "took", time.Since(begin))
	}()
	dir := r.checkpointDir(s)
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return fmt.Errorf("resume %s: its checkpoint is gone (%v): %w", uid, err, errdefs.ErrDataLoss)
	}
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("resume %s: its container is gone: %w", uid, errdefs.ErrDataLoss)
		}
		return fmt.Errorf("resume %s: %w", uid, err)
	}
	labels, err := container.Labels(ctx)
	if err != nil {
		return fmt.Errorf("resume %s: %w", uid, err)
	}
	marker := filepath.Join(r.restoreDir(), id)
	if err := os.WriteFile(marker, []byte(dir), 0o600); err != nil {
		return fmt.Errorf("resume %s: %w", uid, err)
	}
	defer os.Remove(marker)
	if err := r.startTask(ctx, s, container, labels[LabelContainer]); err != nil {
		// What a failed restore left: its task.
		if task, terr := container.Task(context.WithoutCancel(ctx), nil); terr == nil {
			_, _ = task.Delete(context.WithoutCancel(ctx), ctrd.WithProcessKill)
		}
		return fmt.Errorf("resume %s: runsc restore: %v: %w", uid, err, errdefs.ErrDataLoss)
	}
	// The Sentry holds the files it still reads in.
	if err := r.removeCheckpoint(s); err != nil {
		r.log.Warn("resume: remove the checkpoint", "pod", uid, "err", err)
	}
	r.watchReady(s, uid, nil)
	return nil
}

// runscMessage is the gist of a failed runsc command: the first line of
// its output (runsc says what failed first, then may dump goroutines and
// objects), cut to 300 bytes, else the error.
func runscMessage(out []byte, err error) string {
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if first == "" {
		return err.Error()
	}
	if len(first) > 300 {
		first = first[:300] + "…"
	}
	return first
}

// dirSize is the size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// forceDeleteRunsc removes container id from runsc's state by force (its
// sandbox's processes killed), for a container runsc has paused.
func (r *Runtime) forceDeleteRunsc(ctx context.Context, id string) {
	out, err := exec.CommandContext(ctx, r.runscWrapper(), "--root", filepath.Join(runcRoot, r.cfg.Namespace),
		"delete", "--force", id).CombinedOutput()
	if err != nil {
		r.log.Warn("runsc delete --force", "container", id, "err", runscMessage(out, err))
	}
}
