//go:build soak && e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandman-dev/sandman/e2e/soakreport"
	"github.com/sandman-dev/sandman/runtime"
)

// sampler reads every component's RSS and file descriptors, checks for
// double bindings and for processes that died outside a fault, every
// Sample.
func (r *churnRun) sampler(ctx context.Context) {
	defer close(r.sampled)
	tick := time.NewTicker(r.cfg.Sample)
	defer tick.Stop()
	for {
		r.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *churnRun) sampleOnce(ctx context.Context) {
	now := time.Now()
	r.procMu.Lock()
	procs := maps.Clone(r.procs)
	r.procMu.Unlock()
	var ss []soakreport.Sample
	died := map[int]string{}
	faulting := r.faulting.Load()
	for name, pr := range procs {
		u, err := procUsage(pr.pid)
		if err != nil {
			if !faulting && !alive(pr.pid) {
				died[pr.pid] = name
			}
			continue
		}
		ss = append(ss, soakreport.Sample{T: now, Component: name, Gen: pr.gen, PID: pr.pid, RSS: u.rss, Anon: u.anon, FDs: u.fds})
	}
	slots, _ := r.boundSlots(ctx)
	seen := append(soakreport.DoubleBound(slots), prefixed("two running pods report one address: ", soakreport.SharedAddresses(r.watch.running()))...)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, ss...)
	for _, d := range seen {
		sp := r.doubles[d]
		if sp == nil {
			sp = &seenSpan{first: now}
			r.doubles[d] = sp
		}
		sp.last = now
		sp.n++
	}
	for pid, name := range died {
		if !r.crashed[pid] {
			r.crashed[pid] = true
			r.problems = append(r.problems, fmt.Sprintf("at +%v, outside any fault, %s (pid %d) exited", time.Since(r.start).Round(time.Second), name, pid))
		}
	}
}

func prefixed(p string, s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = p + v
	}
	return out
}

// alive reports whether pid runs (and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// boundSlots lists the slots holding pods on the agents that answer, and
// the agents that do not.
func (r *churnRun) boundSlots(ctx context.Context) ([]soakreport.BoundSlot, []string) {
	var out []soakreport.BoundSlot
	var down []string
	for _, a := range r.p.agents {
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		inv, err := a.client.Inventory(ictx)
		cancel()
		if err != nil {
			down = append(down, fmt.Sprintf("%s: %v", a.name, err))
			continue
		}
		for _, s := range inv.Slots {
			if s.Pod != nil && (s.State == runtime.StateBound || s.State == runtime.StateBinding) {
				out = append(out, soakreport.BoundSlot{Agent: a.name, Slot: s.ID, UID: s.Pod.UID, Pod: s.Pod.Namespace + "/" + s.Pod.Name})
			}
		}
	}
	return out, down
}

// launch starts sandman-vk or a node agent again with the same arguments,
// its output appended to a log in the artifacts directory.
func (r *churnRun) launch(logName, bin string, args []string) (*agent, error) {
	f, err := os.OpenFile(filepath.Join(r.artifacts, logName+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "---- started by the soak at %s\n", time.Now().Format(time.RFC3339))
	a := &agent{cmd: exec.Command(bin, args...), out: &bytes.Buffer{}, done: make(chan struct{})}
	fmt.Fprintf(a.out, "(started by the soak; output in %s)\n", f.Name())
	a.cmd.Env = append(os.Environ(), "SANDMAN_POOL_TOKEN=pool-secret")
	a.cmd.Stdout, a.cmd.Stderr = f, f
	if err := a.cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	go func() { _ = a.cmd.Wait(); f.Close(); close(a.done) }()
	return a, nil
}

// stopRestartedAgents stops the agent processes the soak started (the
// pool's cleanups stop the ones it started), then saves the output of the
// first processes that were killed.
func (r *churnRun) stopRestartedAgents() {
	if r.p == nil {
		return
	}
	for _, a := range r.p.agents {
		if a.proc != r.orig[a.name] {
			a.proc.stop(r.t)
		}
	}
	for name, a := range r.orig {
		r.saveOutput(name, a)
	}
	r.saveOutput("sandman-vk", r.origVK)
}

// saveOutput writes a first process's output to the artifacts once it has
// exited (before, its buffer is still being written).
func (r *churnRun) saveOutput(name string, a *agent) {
	if a == nil {
		return
	}
	select {
	case <-a.done:
		_ = os.WriteFile(filepath.Join(r.artifacts, name+".first.log"), a.out.Bytes(), 0o644)
	default:
	}
}
