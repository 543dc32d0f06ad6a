package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// images lists the images of every worker of the pool.
func (c *ctl) images(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "convert" {
		return c.imagesConvert(ctx, args[1:])
	}
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
