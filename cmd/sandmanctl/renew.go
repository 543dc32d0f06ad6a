package main

import "context"

// renew renews a sandbox's idle lease.
func (c *ctl) renew(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fail(exitUsage, "renew: give NAME")
	}
	d, err := c.daemon(ctx, args[0])
	if err != nil {
		return err
	}
	return d.Renew(ctx)
}
