// Command sandmanctl is the trainer's and operator's command line for
// sandboxes: run, exec, cp, ls, rm, renew, get, delete, snapshot, pause,
// resume, fork; the
// pool's images and capacity: prepull, images, top; and version. It
// follows kubectl's kubeconfig conventions (--kubeconfig, $KUBECONFIG,
// ~/.kube/config, the context's namespace) and keeps each sandbox's token
// in a file of its own.
//
// Exit codes: 0 success; for exec, the command's exit code; 1 an error;
// 2 bad usage; 3 no such sandbox or path; 4 the daemon refused the token.
//
// Files: main.go (the global flags, the verbs' dispatch, usage and exit
// codes), client.go (the cluster, the virtual node's routes, a sandbox's
// daemon and its token), and a file per verb: run.go, exec.go, cp.go,
// ls.go, rm.go, renew.go, get.go, delete.go, prepull.go, images.go, convert.go,
// top.go, snapshot.go, pause.go (pause and resume), fork.go, version.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

const usage = `usage: sandmanctl [global flags] COMMAND [flags] [args]

Commands:
  run IMAGE [CMD...]   create a sandbox with a fresh token, wait until it is Ready;
                       --image IMAGE --count N creates N at once (e.g. forks of a snapshot)
  exec NAME -- CMD...  run a command in a sandbox (exit code is the command's)
  cp SRC DST           copy a file or directory; NAME:/path names a sandbox path
  ls NAME:/path        list a directory in a sandbox
  rm NAME:/path        remove a path in a sandbox (-r for directories)
  renew NAME           renew a sandbox's idle lease
  get [NAME]           list sandboxes: node, phase, IP, age, idle time
  delete NAME          delete a sandbox (its slot is released)
  prepull IMAGE...     keep images unpacked on every worker; a progress bar per worker
  images               the images of every worker: state, size, pinned, in use
  images convert IMAGE...
                       convert images to eStargz for lazy pulling and push each beside
                       its source (tag + -esgz, or --to); --prioritize FILE,... go first;
                       needs no cluster (the docker config's registry credentials)
  top nodes            slots, CPU, memory, images and bind latency per worker (--watch)
  snapshot POD IMAGE   commit a sandbox's filesystem changes as IMAGE in the pool's
                       snapshot registry (--container C); prints IMAGE@DIGEST
  pause NAME           pause a gVisor sandbox: its processes and memory are checkpointed
                       to its worker's disk and it holds no memory there (--timeout)
  resume NAME          resume a paused sandbox where it stopped; waits until Ready
  fork NAME            live-fork a running gVisor sandbox: --count N new sandboxes start from
                       its processes, memory and files at one moment, each with its own token
  version              print sandmanctl's version

Global flags:
`

// Exit codes.
const (
	exitError        = 1
	exitUsage        = 2
	exitNotFound     = 3
	exitUnauthorized = 4
)

// cliError carries an exit code.
type cliError struct {
	code int
	err  error
}

func (e cliError) Error() string { return e.err.Error() }

// fail is an error with exit code code.
func fail(code int, format string, args ...any) error {
	return cliError{code: code, err: fmt.Errorf(format, args...)}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is one invocation: the global flags, then the verb; it returns the
// exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sandmanctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default $KUBECONFIG, then ~/.kube/config)")
	namespace := fs.String("n", "", "namespace (default: the kubeconfig context's)")
	home, _ := os.UserHomeDir()
	tokenDir := fs.String("token-dir", filepath.Join(home, ".sandman", "tokens"), "where sandbox tokens are kept")
	token := fs.String("token", os.Getenv("SANDMAN_TOKEN"), "token to use instead of the kept one (or $SANDMAN_TOKEN)")
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	c := &ctl{tokenDir: *tokenDir, token: *token, out: stdout, errw: stderr}
	var err error
	if !needsNoCluster(fs.Args()) {
		err = c.connect(*kubeconfig, *namespace)
	}
	if err == nil {
		err = c.dispatch(ctx, fs.Arg(0), fs.Args()[1:])
	}
	if err == nil {
		return 0
	}
	var ce cliError
	if errors.As(err, &ce) {
		if ce.err != nil && ce.err.Error() != "" {
			fmt.Fprintf(stderr, "sandmanctl: %v\n", ce.err)
		}
		return ce.code
	}
	fmt.Fprintf(stderr, "sandmanctl: %v\n", err)
	switch {
	case apierrors.IsNotFound(err), client.IsCode(err, api.CodeNotFound):
		return exitNotFound
	case client.IsCode(err, api.CodeUnauthorized):
		return exitUnauthorized
	}
	return exitError
}

// needsNoCluster: the verbs that answer without a kubeconfig (version, and
// images convert, which talks to registries only).
func needsNoCluster(args []string) bool {
	return args[0] == "version" || (args[0] == "images" && len(args) > 1 && args[1] == "convert")
}

// dispatch runs the verb cmd with its arguments.
func (c *ctl) dispatch(ctx context.Context, cmd string, args []string) error {
	switch cmd {
	case "run":
		return c.run(ctx, args)
	case "exec":
		return c.exec(ctx, args)
	case "cp":
		return c.cp(ctx, args)
	case "ls":
		return c.ls(ctx, args)
	case "rm":
		return c.rm(ctx, args)
	case "renew":
		return c.renew(ctx, args)
	case "get":
		return c.get(ctx, args)
	case "delete":
		return c.delete(ctx, args)
	case "prepull":
		return c.prepull(ctx, args)
	case "images":
		return c.images(ctx, args)
	case "top":
		return c.top(ctx, args)
	case "snapshot":
		return c.snapshot(ctx, args)
	case "pause":
		return c.pause(ctx, args, true)
	case "fork":
		return c.fork(ctx, args)
	case "resume":
		return c.pause(ctx, args, false)
	case "version":
		return c.showVersion(args)
	}
	return fail(exitUsage, "unknown command %q (run sandmanctl without arguments for the list)", cmd)
}

// Output helpers shared by the verbs.

// orDash is s, or "-" for nothing.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// humanBytes is n in binary units: "512 B", "1.5 MiB".
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
