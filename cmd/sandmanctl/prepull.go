package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

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
	if isTerminal(c.out) {
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
