package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// virtualNode finds the virtual node of pool (or the only one).
func (c *ctl) virtualNode(ctx context.Context, pool string) (string, error) {
	sel := "type=virtual-kubelet," + podcontract.LabelPool
	if pool != "" {
		sel = "type=virtual-kubelet," + podcontract.LabelPool + "=" + pool
	}
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return "", err
	}
	switch len(nodes.Items) {
	case 0:
		return "", fail(exitNotFound, "no sandman virtual node (label %s)", sel)
	case 1:
		return nodes.Items[0].Name, nil
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Labels[podcontract.LabelPool])
	}
	return "", fail(exitUsage, "several pools (%s): choose one with --pool", strings.Join(names, ", "))
}

// nodeProxy is the apiserver's path to the virtual node's sandman routes.
func nodeProxy(node, route string) string {
	return "/api/v1/nodes/" + node + "/proxy" + vkapi.APIPrefix + route
}

// prepull pins images on every worker of the pool and shows a progress bar
// per worker until they are ready everywhere.
func (c *ctl) prepull(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prepull", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	pool := fs.String("pool", "", "pool (default: the only one)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	if fs.NArg() == 0 {
		return fail(exitUsage, "usage: sandmanctl prepull [--pool P] IMAGE...")
	}
	node, err := c.virtualNode(ctx, *pool)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(vkapi.ImagesRequest{Images: fs.Args()})
	stream, err := c.kube.CoreV1().RESTClient().Post().AbsPath(nodeProxy(node, "prepull")).
		Param("timeout", fmt.Sprint(timeout.Seconds())).
		SetHeader("Content-Type", "application/json").Body(body).Stream(ctx)
	if err != nil {
		return fmt.Errorf("pre-pull through %s: %w", node, err)
	}
	defer stream.Close()
	tty := false
	if f, ok := c.out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		tty = true
	}
	var last vkapi.PrePullLine
	drawn := 0
	printed := map[string]string{}
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			return fmt.Errorf("pre-pull stream: %w", err)
		}
		rows := progressRows(last.Nodes)
		if tty {
			if drawn > 0 {
				fmt.Fprintf(c.out, "\x1b[%dA", drawn)
			}
			for _, r := range rows {
				fmt.Fprintf(c.out, "\x1b[2K%s\n", r.text)
			}
			drawn = len(rows)
			continue
		}
		// Not a terminal: a line when a row's state changes.
		for _, r := range rows {
			if printed[r.key] != r.state {
				printed[r.key] = r.state
				fmt.Fprintln(c.out, r.text)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("pre-pull stream: %w", err)
	}
	switch {
	case last.Ready:
		fmt.Fprintf(c.out, "ready on every node\n")
		return nil
	case !last.Done:
		return fail(exitError, "the pre-pull stream ended early")
	}
	var bad []string
	for _, n := range last.Nodes {
		switch {
		case n.NodeError != "":
			bad = append(bad, n.Node+": "+n.NodeError)
		case n.State != runtime.ImageReady:
			bad = append(bad, n.Node+": "+n.Image+": "+orDash(n.Error))
		}
	}
	return fail(exitError, "not ready everywhere:\n  %s", strings.Join(bad, "\n  "))
}

type progressRow struct{ key, state, text string }

func progressRows(nodes []vkapi.NodeImage) []progressRow {
	slices.SortFunc(nodes, func(a, b vkapi.NodeImage) int {
		return strings.Compare(a.Node+" "+a.Image, b.Node+" "+b.Image)
	})
	width := 0
	for _, n := range nodes {
		width = max(width, len(n.Node))
	}
	var rows []progressRow
	for _, n := range nodes {
		key := n.Node + " " + n.Image
		if n.NodeError != "" {
			rows = append(rows, progressRow{key, "error", fmt.Sprintf("%-*s  unreachable: %s", width, n.Node, n.NodeError)})
			continue
		}
		frac := 0.0
		switch {
		case n.State == runtime.ImageReady:
			frac = 1
		case n.BytesTotal > 0:
			frac = float64(n.BytesDone) / float64(n.BytesTotal)
		}
		const barWidth = 30
		full := int(frac * barWidth)
		bar := strings.Repeat("█", full) + strings.Repeat("░", barWidth-full)
		detail := fmt.Sprintf("%s / %s", humanBytes(n.BytesDone), humanBytes(n.BytesTotal))
		switch n.State {
		case runtime.ImageReady:
			detail = "ready"
			if n.SizeBytes > 0 {
				detail += " (" + humanBytes(n.SizeBytes) + " on disk)"
			}
		case runtime.ImageFailed:
			detail = "failed: " + n.Error
		case runtime.ImagePending:
			detail = "waiting to start"
		}
		rows = append(rows, progressRow{key, string(n.State), fmt.Sprintf("%-*s  %s %3.0f%%  %s  %s", width, n.Node, bar, frac*100, n.Image, detail)})
	}
	return rows
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// images lists the images of every worker of the pool.
func (c *ctl) images(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	pool := fs.String("pool", "", "pool (default: the only one)")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	node, err := c.virtualNode(ctx, *pool)
	if err != nil {
		return err
	}
	raw, err := c.kube.CoreV1().RESTClient().Get().AbsPath(nodeProxy(node, "images")).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("images through %s: %w", node, err)
	}
	var all []vkapi.NodeImage
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&all); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	return writeImages(c.out, all)
}

func writeImages(out io.Writer, all []vkapi.NodeImage) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tIMAGE\tSTATE\tSIZE\tPINNED\tIN USE\tLAST USED")
	for _, n := range all {
		if n.NodeError != "" {
			fmt.Fprintf(tw, "%s\t-\tunreachable\t-\t-\t-\t%s\n", n.Node, n.NodeError)
			continue
		}
		size := "-"
		if n.SizeBytes > 0 {
			size = humanBytes(n.SizeBytes)
		}
		used := "-"
		if !n.LastUsed.IsZero() {
			used = time.Since(n.LastUsed).Round(time.Second).String() + " ago"
		}
		state := string(n.State)
		if n.Error != "" {
			state += ": " + n.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%v\t%s\n", n.Node, n.Image, state, size, n.Pinned, n.InUse, used)
	}
	return tw.Flush()
}
