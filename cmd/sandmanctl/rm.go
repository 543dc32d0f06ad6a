package main

import (
	"context"
	"flag"
)

// rm removes a path in a sandbox.
func (c *ctl) rm(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rm", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	recursive := fs.Bool("r", false, "remove directories and their contents")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return fail(exitUsage, "rm: give [-r] NAME:/path")
	}
	name, path, ok := splitRemote(fs.Arg(0))
	if !ok {
		return fail(exitUsage, "rm: %q is not NAME:/path", fs.Arg(0))
	}
	d, err := c.daemon(ctx, name)
	if err != nil {
		return err
	}
	return d.Remove(ctx, path, *recursive)
}
