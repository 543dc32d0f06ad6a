package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"
)

// ls lists a directory in a sandbox.
func (c *ctl) ls(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fail(exitUsage, "ls: give NAME:/path")
	}
	name, path, ok := splitRemote(args[0])
	if !ok {
		return fail(exitUsage, "ls: %q is not NAME:/path", args[0])
	}
	d, err := c.daemon(ctx, name)
	if err != nil {
		return err
	}
	list, err := d.List(ctx, path, 1)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	for _, e := range list.Entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Mode, e.Size, e.ModTime.Format(time.DateTime), e.Name)
	}
	return tw.Flush()
}
