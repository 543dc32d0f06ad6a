package noderuntime

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/internal/lifecycle"
	"github.com/sandman-dev/sandman/runtime"
)

// A sandbox's tasks: started (startTask, newTask), watched until every
// daemon answers (watchReady) and until they exit (watchExit), and a shim
// left behind killed (killOrphanShim).

// taskOpTimeout bounds a task's creation and start, which a bind's caller
// cannot cut short (startTask).
const taskOpTimeout = 2 * time.Minute

// startTask starts a container's task and watches for its exit.
//
// The caller's context does not cut the task's creation or start short:
// containerd finishes creating a task whose client stopped waiting, after
// the failed bind's cleanup looked for it and found none, and that orphan
// (its daemon listening on the slot's port, in the slot's network
// namespace) would keep every later pod of the slot from becoming Ready
// (seen when sandman-vk failed over mid-burst). The bind fails after the
// start instead, if its context ended, and its cleanup finds the task.
func (r *Runtime) startTask(reqCtx context.Context, s *slot, container ctrd.Container, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), taskOpTimeout)
	defer cancel()
	if r.grouped() {
		r.mu.Lock()
		group := s.group
		r.mu.Unlock()
		// Usually running since the slot was made; one that exited is
		// started again. Without it the task still starts (newTask retries
		// a shim on its way out).
		if err := r.ensureHolder(ctx, group); err != nil {
			r.log.Warn("shim group without its holder", "slot", s.ID, "group", group, "err", err)
		}
	}
	t0 := time.Now()
	task, err := r.newTask(ctx, container)
	if err != nil {
		return err
	}
	t1 := time.Now()
	// The exit watch outlives the bind's request: its context must not end
	// with it (a wait broken that way is taken for a containerd restart),
	// only with the runtime.
	exit, err := task.Wait(r.life)
	if err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), ctrd.WithProcessKill)
		return err
	}
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), ctrd.WithProcessKill)
		return err
	}
	r.log.Debug("task started", "container", container.ID(), "create", t1.Sub(t0), "start", time.Since(t1))
	r.mu.Lock()
	epoch := s.epoch
	r.mu.Unlock()
	r.owned.Go(func() { r.watchExit(s, container.ID(), name, exit, epoch) })
	// The container is recorded in the slot (s.containers): a bind that
	// fails now removes its task with it.
	return reqCtx.Err()
}

// watchExit reports a container's exit while its pod is bound (or cools a
// hot slot whose waiting sandbox exited). A wait that breaks because
// containerd restarted is not an exit: the wait is re-established. The
// exit of a task a pause ended (the slot's epoch moved on) is none.
func (r *Runtime) watchExit(s *slot, id, name string, exit <-chan ctrd.ExitStatus, epoch int) {
	var st ctrd.ExitStatus
	for {
		var ok bool
		if st, ok = <-exit; !ok {
			return
		}
		if st.Error() == nil {
			break
		}
		if r.life.Err() != nil {
			return // the runtime closed: the next agent watches the sandbox
		}
		next, lost, released := r.rewait(s, id)
		if released {
			return
		}
		if lost {
			st = *ctrd.NewExitStatus(255, r.cfg.Clock.Now(), nil)
			break
		}
		exit = next
	}
	code := int(st.ExitCode())
	reason := runtime.ReasonCompleted
	if code != 0 {
		reason = runtime.ReasonError
		if r.oomKilled(id) {
			reason = runtime.ReasonOOMKilled
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	message := ""
	if s.evicted != "" {
		reason, message = runtime.ReasonEvicted, s.evicted
	}
	if s.State == runtime.StateHot && slices.Contains(s.containers, id) {
		r.log.Warn("hot sandbox exited while waiting", "slot", s.ID, "image", s.Image, "code", code)
		s.State = runtime.StateBinding // nobody may take it while it is cleaned
		r.owned.Go(func() { r.coolDown(s) })
		return
	}
	if !slices.Contains(s.containers, id) || s.epoch != epoch {
		return // released, or paused
	}
	ev := runtime.Event{Type: runtime.EventExit, Time: st.ExitTime(), Slot: s.Slot.Clone(),
		Container: name, ExitCode: code, Reason: reason, Message: message}
	if s.pausing {
		// A checkpoint ends the sandbox: an exit is one only if the
		// pause fails.
		s.pauseExits = append(s.pauseExits, ev)
		return
	}
	switch s.State {
	case runtime.StateBinding:
		// A main command that ends at once can end before its bind
		// returns: Bind publishes the exit once the slot is bound (a bind
		// that fails drops it).
		s.earlyExits = append(s.earlyExits, ev)
	case runtime.StateBound:
		r.hub.Publish(ev)
	}
}

// rewait re-establishes the exit watch of container id after its wait
// broke (containerd restarting), retrying with backoff. lost: the task is
// gone; released: the slot no longer holds the container, or the runtime
// closed.
func (r *Runtime) rewait(s *slot, id string) (exit <-chan ctrd.ExitStatus, lost, released bool) {
	ctx := r.life
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		r.mu.Lock()
		held := slices.Contains(s.containers, id)
		r.mu.Unlock()
		if !held || !lifecycle.Sleep(ctx, r.cfg.Clock, backoff) {
			return nil, false, true
		}
		container, err := r.client.LoadContainer(ctx, id)
		if errdefs.IsNotFound(err) {
			return nil, true, false
		}
		var task ctrd.Task
		if err == nil {
			task, err = container.Task(ctx, nil)
			if errdefs.IsNotFound(err) {
				return nil, true, false
			}
		}
		if err == nil {
			if exit, err = task.Wait(ctx); err == nil {
				r.log.Info("re-established an exit watch after losing containerd", "slot", s.ID, "container", id)
				return exit, false, false
			}
		}
		r.log.Debug("exit watch: containerd not back yet", "container", id, "err", err)
	}
}

// oomKilled reads the container's memory cgroup OOM-kill count (v1).
func (r *Runtime) oomKilled(id string) bool {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", r.cfg.Namespace, id, "memory.oom_control"))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool {
		return strings.HasPrefix(l, "oom_kill ") && l != "oom_kill 0"
	})
}

// watchReady marks the slot ready once every daemon took the pod's
// assignment a, or, with none (a hot sandbox, assigned by its bind, or one
// assigned before an agent restart), once the first daemon answers.
func (r *Runtime) watchReady(s *slot, uid string, a *assignment) {
	ctx, cancel := context.WithTimeout(r.life, r.cfg.ReadyTimeout)
	r.mu.Lock()
	s.stopReady = cancel
	url := "http://" + s.IP + ":" + strconv.Itoa(api.Port) + "/v1/health"
	ip, dir := s.IP, s.dir
	key := ""
	if s.Pod != nil {
		key = s.Pod.Namespace + "/" + s.Pod.Name
	}
	r.mu.Unlock()
	started := r.owned.Go(func() {
		defer cancel()
		for {
			if a != nil {
				if r.assign(ctx, ip, dir, a) == nil {
					break
				}
			} else {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if resp, err := r.health.Do(req); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
			}
			if !lifecycle.Sleep(ctx, r.cfg.Clock, 5*time.Millisecond) {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					r.log.Warn("sandbox daemon did not answer", "slot", s.ID, "pod", key, "uid", uid, "timeout", r.cfg.ReadyTimeout)
				}
				return
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if s.Pod == nil || s.Pod.UID != uid || s.State == runtime.StateReleasing {
			return
		}
		s.Ready = true
		r.hub.Publish(runtime.Event{Type: runtime.EventReady, Time: r.cfg.Clock.Now(), Slot: s.Slot.Clone()})
	})
	if !started {
		cancel()
	}
}

// newTask creates container's task, again when it met its group's shim on
// its way out.
func (r *Runtime) newTask(ctx context.Context, container ctrd.Container) (ctrd.Task, error) {
	var task ctrd.Task
	var err error
	for attempt := range 4 {
		task, err = container.NewTask(ctx, nullIO)
		if err == nil || !shimGone(err) {
			break
		}
		// The group's shim was exiting as this task asked for it (its last
		// container had just gone): the next attempt starts a new one.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-r.cfg.Clock.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		}
	}
	return task, err
}

// shimGone reports a task creation that met a shim on its way out.
func shimGone(err error) bool {
	msg := err.Error()
	return errdefs.IsUnavailable(err) || strings.Contains(msg, "ttrpc: closed") ||
		strings.Contains(msg, "transport is closing") || strings.Contains(msg, "failed to start shim")
}

// killOrphanShim kills the shim of container id in namespace ns, if one
// runs though containerd knows no task of id: a task create cut off by a
// containerd restart leaves its shim running, and nothing else ever ends
// it. Only a shim started for exactly this container of sandman's own
// namespace is killed, as the container is being removed. Where the agent
// cannot see the node's processes (pod mode without the host's PID
// namespace) it finds none.
func killOrphanShim(ns, id string) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte("containerd-shim")) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		var gotNS, gotID string
		for i := 1; i+1 < len(args); i++ {
			switch args[i] {
			case "-namespace":
				gotNS = args[i+1]
			case "-id":
				gotID = args[i+1]
			}
		}
		if gotNS == ns && gotID == id {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
