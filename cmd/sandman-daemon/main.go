// Command sandman-daemon is the in-sandbox exec, process, session and file
// API. It runs as PID 1 of every sandbox, mounted read-only into the
// unmodified task image; arguments after the flags are the pod's command,
// run as the main process.
//
// Its settings come only from its flags, which the node agent writes; it
// reads none from the environment, which is the pod's and the image's. As
// PID 1 it makes itself undumpable (sandbox code cannot read its memory,
// environment or descriptors through /proc) and ignores every signal but
// SIGTERM, which stops the sandbox as a pod stop does.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/internal/buildinfo"
)

// version is what a release build stamps with -ldflags
// "-X main.version=v1.2.3"; empty, the build info says (buildinfo.Version).
var version string

type hashList []string

func (h *hashList) String() string     { return strings.Join(*h, ",") }
func (h *hashList) Set(v string) error { *h = append(*h, v); return nil }

type options struct {
	listen       string
	socket       string
	hashes       hashList
	assignHash   string
	allowUnauth  bool
	stateDir     string
	maxProcesses int
	restart      string
	maxUpload    int64
	grace        time.Duration
	subreaper    bool
	logLevel     string
	printVersion bool
	hold         bool
}

func main() {
	code, err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandman-daemon: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(args []string) (int, error) {
	var o options
	fs := flag.NewFlagSet("sandman-daemon", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", fmt.Sprintf(":%d", api.Port), "TCP address to serve on (empty: none)")
	fs.StringVar(&o.socket, "socket", "", "unix socket to serve on too")
	fs.Var(&o.hashes, "token-sha256", "hex SHA-256 of an accepted bearer token; repeatable (the node agent does not use it: a command line is readable in /proc, so it assigns tokens over the API)")
	fs.StringVar(&o.assignHash, "assign-token-sha256", "", "start unassigned (a hot slot): hex SHA-256 of the token the node agent assigns the sandbox with")
	fs.BoolVar(&o.allowUnauth, "allow-unauthenticated", false, "accept calls without a token: local experiments only")
	fs.StringVar(&o.stateDir, "state-dir", "/tmp/.sandman", "private directory for session files")
	fs.IntVar(&o.maxProcesses, "max-processes", 256, "processes (execs, background, sessions) alive at once")
	fs.StringVar(&o.restart, "restart-policy", "Never", "the main command's restart policy, as a pod's: Never, OnFailure or Always")
	fs.Int64Var(&o.maxUpload, "max-upload-bytes", 0, "cap on one file upload (0: only the disk)")
	fs.DurationVar(&o.grace, "grace", 10*time.Second, "on stop, how long processes get between TERM and KILL")
	fs.BoolVar(&o.subreaper, "subreaper", false, "reap orphans as a child subreaper when not PID 1")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.printVersion, "version", false, "print the version and exit")
	fs.BoolVar(&o.hold, "hold", false, "serve nothing: wait for SIGTERM or SIGINT, reaping children (the node agent's holder of a shim group)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sandman-daemon [flags] [--] [command [args...]]\n\n"+
			"Serves the sandbox API (docs/daemon-api.md). A command after the flags runs as the\n"+
			"main process; the daemon exits with its code when it exits.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2, nil
	}
	ver := buildinfo.Version(version)
	if o.printVersion {
		fmt.Println("sandman-daemon", ver)
		return 0, nil
	}
	if o.hold {
		return hold(), nil
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return 2, fmt.Errorf("--log-level %q: %w", o.logLevel, err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "daemon")

	cfg := daemon.Config{
		AllowUnauthenticated: o.allowUnauth,
		Env:                  os.Environ(),
		StateDir:             o.stateDir,
		MaxProcesses:         o.maxProcesses,
		RestartPolicy:        o.restart,
		MaxUploadBytes:       o.maxUpload,
		Version:              ver,
		Logger:               log,
	}
	for _, h := range o.hashes {
		sum, err := daemon.ParseTokenHash(h)
		if err != nil {
			return 2, fmt.Errorf("--token-sha256: %w", err)
		}
		cfg.TokenHashes = append(cfg.TokenHashes, sum)
	}
	if o.assignHash != "" {
		sum, err := daemon.ParseTokenHash(o.assignHash)
		if err != nil {
			return 2, fmt.Errorf("--assign-token-sha256: %w", err)
		}
		cfg.AssignTokenHash = &sum
	}
	// Hashes are parsed: wipe them from the command line, which any
	// process of the sandbox can read in /proc/1/cmdline.
	for _, h := range append([]string{o.assignHash}, o.hashes...) {
		scrub(h)
	}
	reapAll := os.Getpid() == 1
	if reapAll {
		hardenPID1(&cfg)
	}
	if !reapAll && o.subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return 1, fmt.Errorf("become a child subreaper: %w", err)
		}
		reapAll = true
	}
	cfg.Reaper = daemon.NewReaper(reapAll)
	srv, err := daemon.New(cfg)
	if err != nil {
		return 2, err
	}

	var listeners []net.Listener
	if o.listen != "" {
		l, err := net.Listen("tcp", o.listen)
		if err != nil {
			return 1, err
		}
		listeners = append(listeners, l)
	}
	if o.socket != "" {
		_ = os.MkdirAll(filepath.Dir(o.socket), 0o755)
		_ = os.Remove(o.socket)
		l, err := net.Listen("unix", o.socket)
		if err != nil {
			return 1, err
		}
		listeners = append(listeners, l)
	}
	if len(listeners) == 0 {
		return 2, fmt.Errorf("nothing to serve on: give --listen or --socket")
	}
	log.Info("serving", "listen", o.listen, "socket", o.socket, "pid", os.Getpid(), "version", ver,
		"tokens", len(cfg.TokenHashes), "unauthenticated", o.allowUnauth)
	return srv.Supervise(context.Background(), listeners, fs.Args(), o.grace)
}

// hold keeps a shim group's runc shim alive for the node agent: a container
// whose only process waits for SIGTERM or SIGINT (and reaps, as PID 1
// must), so the shim always has a task while its group has slots.
func hold() int {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, unix.SIGTERM, unix.SIGINT)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	fmt.Println("holding")
	for {
		select {
		case <-stop:
			return 0
		case <-chld:
			for {
				var ws unix.WaitStatus
				if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}

// hardenPID1 keeps sandbox code, which runs as the same user, from reading
// the daemon through /proc (an undumpable process's memory, environ, fds and
// maps need CAP_SYS_PTRACE, which sandboxes lack) and from ending it with a
// signal: the kernel delivers to a namespace's init only the signals it
// handles, and the daemon handles every catchable one, acting on none but
// SIGTERM (and SIGCHLD, for reaping). SIGKILL and SIGSTOP from inside never
// reach init at all.
func hardenPID1(cfg *daemon.Config) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		cfg.Logger.Warn("could not make the daemon undumpable", "err", err)
	}
	// Handled and dropped, not ignored: an ignored disposition would pass
	// to every command through exec (a shell would not stop on Ctrl-C,
	// `yes | head` would not end on SIGPIPE), while exec resets handled
	// ones to their defaults.
	sink := make(chan os.Signal, 16)
	signal.Notify(sink, ignoredSignals...)
	go func() {
		for range sink {
		}
	}()
	cfg.StopSignals = []os.Signal{unix.SIGTERM}
	reserveThreads(reservedThreads)
}

// reservedThreads is how many OS threads the daemon starts as PID 1 and keeps
// idle: more than it ever blocks in system calls at once while a bomb runs
// (the reaper's wait, a file call), at ~24 KiB of kernel and stack memory
// each and as many pids of the sandbox's limit (1,024 by default).
const reservedThreads = 8

// reserveThreads starts n OS threads now and leaves them idle: the Go
// runtime keeps an idle thread for the next one it needs, and aborts the
// process when it cannot create one. The sandbox's processes share the
// daemon's pids limit, so a fork bomb that fills it would otherwise end the
// daemon the first time a blocking system call needed a new thread; with the
// reserve it serves on and the bomb's exec fails alone.
func reserveThreads(n int) {
	var started, release sync.WaitGroup
	release.Add(1)
	for range n {
		started.Add(1)
		go func() {
			// Locked and parked, each goroutine holds its thread, so the
			// next one needs a new thread.
			runtime.LockOSThread()
			started.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	started.Wait()
	release.Done()
}

// ignoredSignals are every catchable signal but SIGTERM and SIGCHLD. For
// the fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL) Go passes on only
// those another process sends: a real fault still crashes the daemon.
var ignoredSignals = []os.Signal{
	unix.SIGSEGV, unix.SIGBUS, unix.SIGFPE,
	unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGILL, unix.SIGTRAP, unix.SIGABRT,
	unix.SIGUSR1, unix.SIGUSR2, unix.SIGPIPE, unix.SIGALRM, unix.SIGSTKFLT, unix.SIGCONT,
	unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU, unix.SIGURG, unix.SIGXCPU, unix.SIGXFSZ,
	unix.SIGVTALRM, unix.SIGPROF, unix.SIGWINCH, unix.SIGIO, unix.SIGPWR, unix.SIGSYS,
}

// scrub overwrites a command-line argument (or part of one) in place. Go's
// os.Args strings share the memory of the process's argv, which is what
// /proc/PID/cmdline shows; the flag values parsed from them are substrings
// of those strings. The caller must not use s afterwards.
func scrub(s string) {
	if s == "" {
		return
	}
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for i := range b {
		b[i] = '*'
	}
}
