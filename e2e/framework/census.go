package framework

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// A Census is what the tests can leave behind on the machine: containerd
// containers and tasks, the mounts sandboxes and kubelet pods make
// (root filesystems, network namespaces, volumes) and shim processes. Main
// takes one before the tests and one after, and fails the tier when the
// second holds anything the first did not: each test must release what it
// bound.
type Census struct {
	// Containers and Tasks are "namespace/id".
	Containers, Tasks []string
	// Namespaces existing when the census was taken.
	Namespaces []string
	Mounts     []string
	// Shims are "pid namespace/id".
	Shims []string
}

// watched reports whether leaks in containerd namespace ns count: the
// namespaces tests create (sandman-e2e-*, the deployed pool's, the
// kubelet's) and any that did not exist before the tests. A pool a
// developer runs beside the tests (make run) keeps its own namespace, whose
// warm slots come and go, and is not counted.
func watched(ns string, before *Census) bool {
	if strings.HasPrefix(ns, "sandman-e2e-") || ns == "k8s.io" || ns == "sandman-deployed" {
		return true
	}
	return before != nil && !slices.Contains(before.Namespaces, ns)
}

// TakeCensus counts what is on the machine now.
func TakeCensus(ctx context.Context, address string) (*Census, error) {
	c := &Census{}
	client, err := containerd.New(address, containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w", address, err)
	}
	defer client.Close()
	nss, err := client.NamespaceService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containerd namespaces: %w", err)
	}
	c.Namespaces = nss
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		cs, err := client.ContainerService().List(nctx)
		if err != nil {
			return nil, fmt.Errorf("list containers in %s: %w", ns, err)
		}
		for _, ct := range cs {
			c.Containers = append(c.Containers, ns+"/"+ct.ID)
		}
		ts, err := client.TaskService().List(nctx, &tasks.ListTasksRequest{})
		if err != nil {
			return nil, fmt.Errorf("list tasks in %s: %w", ns, err)
		}
		for _, t := range ts.Tasks {
			c.Tasks = append(c.Tasks, ns+"/"+t.ID)
		}
	}
	if c.Mounts, err = mounts(); err != nil {
		return nil, err
	}
	c.Shims = shims()
	return c, nil
}

// Leaks lists what after holds that c does not, in the places tests may
// leave things.
func (c *Census) Leaks(after *Census) []string {
	var out []string
	nsOf := func(s string) string { ns, _, _ := strings.Cut(s, "/"); return ns }
	for _, ct := range after.Containers {
		if watched(nsOf(ct), c) && !slices.Contains(c.Containers, ct) {
			out = append(out, "container "+ct)
		}
	}
	for _, t := range after.Tasks {
		if watched(nsOf(t), c) && !slices.Contains(c.Tasks, t) {
			out = append(out, "task "+t)
		}
	}
	for _, m := range after.Mounts {
		if !slices.Contains(c.Mounts, m) && c.ours(m, after) {
			out = append(out, "mount "+m)
		}
	}
	for _, s := range after.Shims {
		_, nsid, _ := strings.Cut(s, " ")
		if watched(nsOf(nsid), c) && !slices.Contains(c.Shims, s) {
			out = append(out, "shim "+s)
		}
	}
	return out
}

// Holding lists what c holds of containerd namespace ns (containers,
// tasks, shims, task root filesystems) and the mounts under any of dirs:
// what a node agent of that namespace left when it stopped.
func (c *Census) Holding(ns string, dirs ...string) []string {
	var out []string
	for _, ct := range c.Containers {
		if strings.HasPrefix(ct, ns+"/") {
			out = append(out, "container "+ct)
		}
	}
	for _, t := range c.Tasks {
		if strings.HasPrefix(t, ns+"/") {
			out = append(out, "task "+t)
		}
	}
	for _, m := range c.Mounts {
		in := strings.Contains(m, "/io.containerd.runtime.v2.task/"+ns+"/")
		for _, d := range dirs {
			in = in || strings.HasPrefix(m, strings.TrimSuffix(d, "/")+"/")
		}
		if in {
			out = append(out, "mount "+m)
		}
	}
	for _, s := range c.Shims {
		if _, nsid, _ := strings.Cut(s, " "); strings.HasPrefix(nsid, ns+"/") {
			out = append(out, "shim "+s)
		}
	}
	return out
}

// ours: a mount point sandboxes or kubelet pods make.
func (c *Census) ours(m string, after *Census) bool {
	for _, mark := range []string{"/e2e-nodes/", "/var/lib/sandman-node/", "/kubelet/pods/", "/run/netns/cni-"} {
		if strings.Contains(m, mark) {
			return true
		}
	}
	if _, rest, ok := strings.Cut(m, "/io.containerd.runtime.v2.task/"); ok {
		ns, _, _ := strings.Cut(rest, "/")
		return watched(ns, c)
	}
	return false
}

func mounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out, sc.Err()
}

// shims lists containerd shim processes as "pid namespace/id".
func shims() []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("containerd-shim")) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		ns, id := "", ""
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-namespace", "--namespace":
				ns = args[i+1]
			case "-id", "--id":
				id = args[i+1]
			}
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		out = append(out, fmt.Sprintf("%d %s/%s", pid, ns, id))
	}
	return out
}
