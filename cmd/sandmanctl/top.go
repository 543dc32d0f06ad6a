package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// top shows the pool's capacity per worker node, the numbers of the
// capacity page.
func (c *ctl) top(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "nodes" {
		return fail(exitUsage, "usage: sandmanctl top nodes [--pool P] [--watch] [--interval D]")
	}
	fs := flag.NewFlagSet("top nodes", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	pool := fs.String("pool", "", "pool (default: the only one)")
	watch := fs.Bool("watch", false, "refresh until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "refresh interval with --watch")
	if err := fs.Parse(args[1:]); err != nil {
		return cliError{code: exitUsage}
	}
	node, err := c.virtualNode(ctx, *pool)
	if err != nil {
		return err
	}
	tty := false
	if isTerminal(c.out) {
		tty = true
	}
	for {
		raw, err := c.kube.CoreV1().RESTClient().Get().AbsPath(nodeProxy(node, "capacity")).DoRaw(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("capacity through %s: %w", node, err)
		}
		var capa vkapi.Capacity
		if err := json.Unmarshal(raw, &capa); err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
		if *watch && tty {
			fmt.Fprint(c.out, "\x1b[H\x1b[2J")
		}
		writeTop(c.out, capa)
		if !*watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
		if !tty {
			fmt.Fprintln(c.out)
		}
	}
}

func writeTop(out io.Writer, c vkapi.Capacity) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "NODE\tHEALTH\tWARM\tHOT\tBINDING\tBOUND\tPAUSED\tRECYCLING\tBROKEN\tSLOTS\tCPU\tMEMORY\tIMAGES\tBIND P50\tBIND P99\t")
	row := func(name, health string, s map[runtime.SlotState]int, slots int, cpu, mem vkapi.Amount, images, p50, p99 string) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, health,
			s[runtime.StateWarm], s[runtime.StateHot], s[runtime.StateBinding], s[runtime.StateBound], s[runtime.StatePaused],
			s[runtime.StateReleasing], s[runtime.StateBroken], slots,
			fmt.Sprintf("%.2f/%.2f", cpu.Allocated, cpu.Capacity),
			compactBytes(mem.Allocated)+"/"+compactBytes(mem.Capacity), images, p50, p99)
	}
	lat := func(binds int, v float64) string {
		if binds == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fms", v)
	}
	for _, n := range c.Nodes {
		health := "healthy"
		if !n.Healthy {
			health = "UNHEALTHY"
		}
		row(n.Name, health, n.Slots, n.CapacitySlots, n.CPU, n.Memory, fmt.Sprint(max(n.ImageCount, len(n.Images))),
			lat(n.Binds, n.BindP50MS), lat(n.Binds, n.BindP99MS))
	}
	t := c.Totals
	row("TOTAL", fmt.Sprintf("%d/%d", t.HealthyNodes, t.Nodes), t.Slots, t.CapacitySlots, t.CPU, t.Memory, "", "", "")
	_ = tw.Flush()
	h := c.CreateToReady
	ready := "-"
	if h.Count > 0 {
		ready = fmt.Sprintf("p50 %.0fms p99 %.0fms over %d", h.P50MS, h.P99MS, h.Count)
	}
	fmt.Fprintf(out, "pool %s (%s) at %s: queue %d, binds in flight %d, pods %s, create→Ready (last %s) %s\n",
		c.Pool, c.VirtualNode, c.Time.Local().Format(time.TimeOnly), c.Queue, t.Inflight, phases(c), h.Window, ready)
	if len(c.Nodes) > 0 && t.HealthyNodes < t.Nodes {
		var down []string
		for _, n := range c.Nodes {
			if !n.Healthy {
				down = append(down, n.Name+": "+n.Error)
			}
		}
		fmt.Fprintf(out, "unhealthy: %s\n", strings.Join(down, "; "))
	}
}

func phases(c vkapi.Capacity) string {
	var parts []string
	for _, ph := range []string{"Pending", "Running", "Succeeded", "Failed"} {
		if v, ok := c.Pods[ph]; ok {
			parts = append(parts, fmt.Sprintf("%d %s", v, strings.ToLower(ph)))
		}
	}
	return strings.Join(parts, ", ")
}

func compactBytes(v float64) string { return strings.ReplaceAll(humanBytes(int64(v)), " ", "") }
