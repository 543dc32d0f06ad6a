package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandman-dev/sandman/daemon/api"
)

// exec streams a command's output and returns its exit code.
func (c *ctl) exec(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	timeout := fs.Int("timeout", 0, "seconds before the command (and its children) is killed")
	cwd := fs.String("cwd", "", "working directory")
	stdin := fs.Bool("i", false, "pass stdin to the command")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	rest := fs.Args()
	if len(rest) < 2 {
		return fail(exitUsage, "exec: give NAME -- CMD...")
	}
	name, cmd := rest[0], rest[1:]
	if cmd[0] == "--" {
		cmd = cmd[1:]
	}
	if len(cmd) == 0 {
		return fail(exitUsage, "exec: no command after --")
	}
	d, err := c.daemon(ctx, name)
	if err != nil {
		return err
	}
	req := api.ExecRequest{Cmd: cmd, Cwd: *cwd, TimeoutSeconds: float64(*timeout)}
	if *stdin {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		req.Stdin = b
	}
	stream, err := d.ExecStream(ctx, req)
	if err != nil {
		return err
	}
	defer stream.Close()
	for {
		ev, err := stream.Next()
		if err != nil {
			return fail(exitError, "exec in %s: the stream ended early: %v", name, err)
		}
		switch ev.Type {
		case api.EventStdout:
			_, _ = c.out.Write(ev.Data)
		case api.EventStderr:
			_, _ = c.errw.Write(ev.Data)
		case api.EventExit:
			code := 0
			if ev.ExitCode != nil {
				code = *ev.ExitCode
			}
			if ev.TimedOut {
				fmt.Fprintf(c.errw, "sandmanctl: the command timed out after %ds and was killed\n", *timeout)
			}
			if code != 0 {
				return cliError{code: code}
			}
			return nil
		case api.EventError:
			if ev.Error != nil {
				return fail(exitError, "exec in %s: %s", name, ev.Error.Message)
			}
		}
	}
}
