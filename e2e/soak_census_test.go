//go:build soak && e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/e2e/soakreport"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

// censusAgent is a node agent whose leftovers the soak counts.
type censusAgent struct {
	name, namespace, stateDir string
	client                    *nodeapi.Client
}

func censusAgentOf(a *vagent) censusAgent {
	return censusAgent{name: a.name, namespace: a.namespace, stateDir: argValue(a.args, "--state-dir"), client: a.client}
}

// cniIPAMDir is where host-local keeps the addresses of the stack's
// "sandman" network (hack/local-up.sh: dataDir $SANDMAN_STATE/cni/ipam).
func cniIPAMDir() string { return filepath.Join(framework.StateDir(), "cni", "ipam", "sandman") }

// takeSoakCensus counts what sandboxes can leave behind: for each agent
// its containerd containers, tasks, snapshots, leases and images, its
// mounts, network namespaces, slot directories and slots, its cgroups, its
// shims and the processes under them, its own process; and on the host the
// CNI address allocations, iptables rules, sandman-vk's process (vkNode)
// and, shown only, host-wide counts the soak does not own.
func takeSoakCensus(ctx context.Context, s *framework.Stack, agents []censusAgent, vkNode string) (soakreport.Census, error) {
	cc, err := containerd.New(s.ContainerdAddress, containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("census: containerd: %w", err)
	}
	defer cc.Close()
	procs := readProcs()
	mounts := mountPoints()
	var c soakreport.Census
	// add(name)(items, err) records an entry.
	add := func(name string) func([]string, error) {
		return func(items []string, err error) {
			e := soakreport.Entry{Name: name, N: len(items), Items: items}
			if err != nil {
				e.Err = err.Error()
			}
			c = append(c, e)
		}
	}
	for _, a := range agents {
		p := a.name + ": "
		nctx := namespaces.WithNamespace(ctx, a.namespace)
		add(p + "containerd containers")(containerIDs(nctx, cc))
		add(p + "containerd tasks")(taskIDs(nctx, cc))
		add(p + "containerd snapshots")(snapshotKeys(nctx, cc))
		add(p + "containerd leases")(leaseIDs(nctx, cc))
		add(p + "containerd images")(imageNames(nctx, cc))
		add(p+"rootfs mounts")(filter(mounts, func(m string) bool {
			return strings.Contains(m, "/io.containerd.runtime.v2.task/"+a.namespace+"/")
		}), nil)
		add(p+"mounts under its state dir")(filter(mounts, func(m string) bool { return strings.HasPrefix(m, a.stateDir+"/") }), nil)
		add(p + "network namespaces")(dirNames(filepath.Join(a.stateDir, "netns")))
		add(p + "slot directories")(dirNames(filepath.Join(a.stateDir, "slots")))
		warm, other, ierr := slotStates(ctx, a.client)
		add(p+"slots warm")(warm, ierr)
		add(p+"slots not warm")(other, ierr)
		add(p+"cgroups")(cgroupDirs(a.namespace), nil)
		shims := procs.shims(a.namespace)
		add(p+"shim processes")(shims.strings(), nil)
		add(p+"processes under its shims")(procs.descendants(shims).strings(), nil)
		add(p+"agent processes")(procs.matching(func(pr proc) bool {
			return pr.base() == "sandman-node" && slices.Contains(pr.argv, a.stateDir)
		}).strings(), nil)
	}
	if vkNode != "" {
		add("sandman-vk processes ("+vkNode+")")(procs.matching(func(pr proc) bool {
			return pr.base() == "sandman-vk" && slices.Contains(pr.argv, vkNode)
		}).strings(), nil)
	}
	add("CNI address allocations (network sandman)")(ipAllocations())
	ours, all, ierr := iptablesRules()
	add("iptables rules naming sandman or CNI")(ours, ierr)
	info := func(name string, n int, err error) {
		e := soakreport.Entry{Name: name, N: n, Info: true}
		if err != nil {
			e.Err = err.Error()
		}
		c = append(c, e)
	}
	info("iptables rules, all (host-wide)", len(all), ierr)
	info("mounts (host-wide)", len(mounts), nil)
	runNetns, _ := dirNames("/run/netns")
	info("network namespaces in /run/netns (host-wide)", len(runNetns), nil)
	info("containerd shims (host-wide)", len(procs.matching(func(pr proc) bool { return strings.HasPrefix(pr.base(), "containerd-shim") })), nil)
	info("sandman-daemon processes (host-wide)", len(procs.matching(func(pr proc) bool { return pr.comm == "sandman-daemon" })), nil)
	info("zombie processes (host-wide)", len(procs.matching(func(pr proc) bool { return pr.state == "Z" })), nil)
	return c, nil
}

// settleCensus takes censuses until nothing differs from before in what
// the soak owns, or timeout passes, and returns the last and its leaks.
func settleCensus(ctx context.Context, s *framework.Stack, agents []censusAgent, vkNode string, before soakreport.Census, timeout time.Duration) (soakreport.Census, []soakreport.Delta) {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		after, err := takeSoakCensus(cctx, s, agents, vkNode)
		cancel()
		var leaks []soakreport.Delta
		if err != nil {
			leaks = []soakreport.Delta{{Name: "census", Err: err.Error()}}
		} else {
			leaks = soakreport.Leaks(soakreport.Diff(before, after))
		}
		if len(leaks) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return after, leaks
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

// waitAllWarm waits until each agent's slots are all warm, as many as
// want says.
func waitAllWarm(ctx context.Context, agents []censusAgent, want map[string]int, timeout time.Duration) error {
	var last string
	deadline := time.Now().Add(timeout)
	for {
		last = ""
		for _, a := range agents {
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			inv, err := a.client.Inventory(ictx)
			cancel()
			switch {
			case err != nil:
				last = fmt.Sprintf("%s: %v", a.name, err)
			case len(inv.Slots) != want[a.name] || inv.Count()[runtime.StateWarm] != want[a.name]:
				last = fmt.Sprintf("%s: slots %v, want %d warm", a.name, inv.Count(), want[a.name])
			}
		}
		if last == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("every slot warm: not within %v: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func containerIDs(ctx context.Context, cc *containerd.Client) ([]string, error) {
	cs, err := cc.ContainerService().List(ctx)
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out, err
}

func taskIDs(ctx context.Context, cc *containerd.Client) ([]string, error) {
	ts, err := cc.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ts.Tasks))
	for _, t := range ts.Tasks {
		out = append(out, t.ID)
	}
	return out, nil
}

func snapshotKeys(ctx context.Context, cc *containerd.Client) ([]string, error) {
	var out []string
	err := cc.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		out = append(out, info.Name)
		return nil
	})
	return out, err
}

func leaseIDs(ctx context.Context, cc *containerd.Client) ([]string, error) {
	ls, err := cc.LeasesService().List(ctx)
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		out = append(out, l.ID)
	}
	return out, err
}

func imageNames(ctx context.Context, cc *containerd.Client) ([]string, error) {
	is, err := cc.ImageService().List(ctx)
	out := make([]string, 0, len(is))
	for _, i := range is {
		out = append(out, i.Name)
	}
	return out, err
}

// slotStates lists an agent's warm slots and the others ("id state").
func slotStates(ctx context.Context, c *nodeapi.Client) (warm, other []string, err error) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	inv, err := c.Inventory(ictx)
	if err != nil {
		return nil, nil, fmt.Errorf("inventory: %w", err)
	}
	for _, s := range inv.Slots {
		if s.State == runtime.StateWarm {
			warm = append(warm, s.ID)
		} else {
			other = append(other, s.ID+" "+string(s.State))
		}
	}
	return warm, other, nil
}

// cgroupDirs lists the cgroups under the namespace's parent (containerd's
// default cgroupsPath is /<namespace>/<id>), per controller on cgroup v1.
func cgroupDirs(namespace string) []string {
	var parents []string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		parents = []string{filepath.Join("/sys/fs/cgroup", namespace)}
	} else {
		for _, ctl := range []string{"memory", "pids", "cpu", "cpuset", "blkio", "devices", "freezer"} {
			parents = append(parents, filepath.Join("/sys/fs/cgroup", ctl, namespace))
		}
	}
	var out []string
	for _, p := range parents {
		es, _ := os.ReadDir(p)
		for _, e := range es {
			if e.IsDir() {
				out = append(out, filepath.Join(filepath.Base(filepath.Dir(p)), e.Name()))
			}
		}
	}
	return out
}

// ipAllocations lists host-local's allocations as "ip owner".
func ipAllocations() ([]string, error) {
	es, err := os.ReadDir(cniIPAMDir())
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range es {
		n := e.Name()
		if e.IsDir() || n == "lock" || strings.HasPrefix(n, "last_reserved_ip") {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(cniIPAMDir(), n))
		owner, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		out = append(out, n+" "+strings.TrimSpace(owner))
	}
	return out, nil
}

// iptablesRules returns the rules (-A lines of iptables-save) that name
// sandman or CNI, and all of them.
func iptablesRules() (ours, all []string, err error) {
	out, err := exec.Command("iptables-save").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("iptables-save: %w", err)
	}
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "*") {
			table = line[1:]
		}
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		rule := table + " " + line
		all = append(all, rule)
		if l := strings.ToLower(line); strings.Contains(l, "sandman") || strings.Contains(line, "CNI-") {
			ours = append(ours, rule)
		}
	}
	return ours, all, sc.Err()
}

func dirNames(dir string) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out, nil
}

func mountPoints() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out
}

func filter(s []string, keep func(string) bool) []string {
	var out []string
	for _, v := range s {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

// proc is one process from /proc.
type proc struct {
	pid, ppid int
	state     string
	comm      string
	argv      []string
}

func (p proc) base() string {
	if len(p.argv) == 0 {
		return p.comm
	}
	return filepath.Base(p.argv[0])
}

type procList []proc

func (l procList) strings() []string {
	out := make([]string, 0, len(l))
	for _, p := range l {
		out = append(out, fmt.Sprintf("%d %s", p.pid, p.base()))
	}
	return out
}

func (l procList) matching(keep func(proc) bool) procList {
	var out procList
	for _, p := range l {
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// shims are the containerd shims of one namespace.
func (l procList) shims(namespace string) procList {
	return l.matching(func(p proc) bool {
		ns := argValue(p.argv, "-namespace")
		if ns == "" {
			ns = argValue(p.argv, "--namespace")
		}
		return strings.HasPrefix(p.base(), "containerd-shim") && ns == namespace
	})
}

// descendants are the processes under roots (not the roots).
func (l procList) descendants(roots procList) procList {
	in := map[int]bool{}
	for _, r := range roots {
		in[r.pid] = true
	}
	var out procList
	for changed := true; changed; {
		changed = false
		for _, p := range l {
			if !in[p.pid] && in[p.ppid] {
				in[p.pid] = true
				out = append(out, p)
				changed = true
			}
		}
	}
	return out
}

func readProcs() procList {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out procList
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		s := string(stat)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		p := proc{pid: pid, ppid: ppid, state: f[0], comm: s[open+1 : closing]}
		if cl, err := os.ReadFile(d + "/cmdline"); err == nil && len(cl) > 0 {
			p.argv = strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
		}
		out = append(out, p)
	}
	return out
}

// usage is a process's resident memory (VmRSS and its anonymous part,
// RssAnon, in bytes: file-backed pages such as etcd's mmapped database
// count in the first only) and its open file descriptors.
type usage struct {
	rss, anon int64
	fds       int
}

func procUsage(pid int) (usage, error) {
	var u usage
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	kb := func(v string) int64 {
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return n << 10
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			u.rss = kb(v)
		} else if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			u.anon = kb(v)
		}
	}
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return u, err
	}
	u.fds = len(es)
	return u, nil
}
