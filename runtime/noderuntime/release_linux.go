package noderuntime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/internal/lifecycle"
	"github.com/sandman-dev/sandman/runtime"
)

// Release implements runtime.Runtime.
func (r *Runtime) Release(ctx context.Context, uid string, grace time.Duration) error {
	ctx = r.nsCtx(ctx)
	for {
		r.mu.Lock()
		s, ok := r.byPod[uid]
		if !ok || s.State == runtime.StateReleasing {
			r.mu.Unlock()
			return nil
		}
		// A bind (or a resume) finishes or fails first; a snapshot that
		// reads the sandbox's filesystem (frozen) finishes that part
		// first, a pause its checkpoint, and an egress change its
		// firewall (the next bind adds to a clean one).
		if s.State != runtime.StateBinding && s.snapshots == 0 && s.forking == 0 && !s.pausing && !s.egressing {
			if s.stopReady != nil {
				s.stopReady()
			}
			s.Ready = false
			r.setLocked(s, runtime.StateReleasing)
			r.releases.Add(1)
			r.mu.Unlock()
			break
		}
		r.mu.Unlock()
		if !lifecycle.Sleep(ctx, r.cfg.Clock, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
	defer r.releases.Done()
	r.mu.Lock()
	s := r.byPod[uid]
	ids := slices.Clone(s.containers)
	r.mu.Unlock()
	begin := time.Now()
	err := r.removeContainers(ctx, s, grace)
	r.forgetNames(s)
	r.dropForksOf(uid)
	// Back to the base firewall now, so the next bind only adds to it (a
	// reset waits for a kernel grace period: here, not on a bind).
	clean := false
	if err == nil {
		var ferr error
		if clean, ferr = r.firewall(s.netns.GetPath(), s.IP, nil, false); ferr != nil {
			r.log.Warn("reset the firewall of a released slot", "slot", s.ID, "err", ferr)
		}
	}
	r.metrics.releaseSeconds.Observe(time.Since(begin).Seconds())
	r.mu.Lock()
	defer r.mu.Unlock()
	s.fwClean = clean
	delete(r.byPod, uid)
	s.Pod, s.Image, s.Resources, s.containers, s.assignToken = nil, "", runtime.Resources{}, nil, ""
	s.diskLimits, s.diskUsed, s.evicted, s.fwReq, s.moving, s.lazyLowers = nil, nil, "", nil, false, nil
	clearAssignment(s.dir)
	if cerr := r.removeCheckpoint(s); cerr != nil {
		err = errors.Join(err, cerr)
	}
	s.checkpointBytes = 0
	if err != nil {
		s.Reason, s.leftovers = err.Error(), ids
		r.setLocked(s, runtime.StateBroken)
		return fmt.Errorf("release %s: %w", uid, err)
	}
	r.metrics.recycles.Inc()
	r.setLocked(s, runtime.StateWarm)
	r.wake()
	return nil
}

// removeContainers stops the slot's containers (TERM, grace, KILL) and
// deletes them with their snapshots.
func (r *Runtime) removeContainers(ctx context.Context, s *slot, grace time.Duration) error {
	r.mu.Lock()
	ids := slices.Clone(s.containers)
	r.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.removeContainer(ctx, id, grace)
		}()
	}
	wg.Wait()
	r.mu.Lock()
	freed := false
	for _, id := range ids {
		freed = r.cpus.releaseLocked(id) || freed
	}
	r.mu.Unlock()
	if freed {
		r.rebalanceCPUs() // the freed cores rejoin the shared pool
	}
	return errors.Join(errs...)
}

func (r *Runtime) removeContainer(ctx context.Context, id string, grace time.Duration) error {
	container, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if task, err := container.Task(ctx, nil); err == nil {
		var opts []ctrd.ProcessDeleteOpts
		if exit, err := task.Wait(ctx); err == nil {
			exited := false
			wait := func(d time.Duration) {
				t := r.cfg.Clock.NewTimer(d)
				defer t.Stop()
				select {
				case <-exit:
					exited = true
				case <-t.C():
				}
			}
			if grace > 0 {
				_ = task.Kill(ctx, syscall.SIGTERM)
				wait(grace)
			}
			if !exited {
				_ = task.Kill(ctx, syscall.SIGKILL, ctrd.WithKillAll)
				wait(10 * time.Second)
			}
			// Not killed again once a gVisor sandbox has exited: runsc,
			// unlike runc, answers a kill of a stopped sandbox with an
			// error the shim does not take for "already finished", and
			// the delete would fail. runc tasks keep the kill before the
			// delete (a pod's containers share a shim and are removed
			// at once; the kill's wait orders their deletes).
			if !exited || !r.isGVisor(ctx, container) {
				opts = append(opts, ctrd.WithProcessKill)
			}
		} else {
			opts = append(opts, ctrd.WithProcessKill)
		}
		_, err := task.Delete(ctx, opts...)
		if err != nil && (strings.Contains(err.Error(), "without --force") || strings.Contains(err.Error(), "not started")) && r.isGVisor(ctx, container) {
			// A gVisor sandbox runsc still has paused (a pause whose
			// checkpoint failed and could not let it run again): a kill
			// is not delivered to its stopped tasks, and the shim's
			// delete refuses it. Or one whose restore failed (a fork's or
			// a resume's): runsc has it created, never started, and
			// refuses to signal it. runsc removes it by force.
			r.forceDeleteRunsc(ctx, id)
			_, err = task.Delete(ctx, opts...)
		}
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task %s: %w", id, err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("task of %s: %w", id, err)
	} else {
		killOrphanShim(r.cfg.Namespace, id)
	}
	if err := container.Delete(ctx, ctrd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container %s: %w", id, err)
	}
	return nil
}
