package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"time"

	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// mainSpec is the main process to run and its restart policy.
type mainSpec struct {
	argv          []string
	restartPolicy string
}

// checkRestartPolicy accepts a pod's restart policies ("" is Never).
func checkRestartPolicy(p string) error {
	switch p {
	case "", "Never", "OnFailure", "Always":
		return nil
	}
	return fmt.Errorf("restart policy %q: want Never, OnFailure or Always", p)
}

// restartWanted says whether a main process that exited with code is
// started again under policy.
func restartWanted(policy string, code int) bool {
	return policy == "Always" || policy == "OnFailure" && code != 0
}

// restartDelay backs restarts off as a kubelet does, from 1 s doubling to
// 5 min; a run of 10 min or more starts the back-off over.
func restartDelay(restarts int, ran time.Duration) time.Duration {
	if ran >= 10*time.Minute {
		return time.Second
	}
	d := time.Second
	for i := 1; i < restarts && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}

// Supervise is the daemon's life as PID 1 of a sandbox. It serves the API on
// every listener, runs main (the pod's command, if any) as the main process
// whose output is kept for logs and copied to the daemon's own stdout and
// stderr, and returns the code the daemon should exit with:
//   - when main exits and its restart policy (Config.RestartPolicy, or the
//     assignment's) does not start it again: its exit code, after the
//     other process groups got TERM and up to grace to go;
//   - on a stop signal (Config.StopSignals): TERM goes to every process group the daemon
//     started, KILL after grace; the code is main's if it ended, else 0;
//   - when ctx ends: as on SIGTERM.
func (s *Server) Supervise(ctx context.Context, listeners []net.Listener, main []string, grace time.Duration) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, s.cfg.StopSignals...)
	defer signal.Stop(stop)

	var mainDone <-chan struct{}
	var mainProc *process.Process
	var spec mainSpec
	tee := func(stream string, b []byte) {
		if stream == "stderr" {
			_, _ = os.Stderr.Write(b)
		} else {
			_, _ = os.Stdout.Write(b)
		}
	}
	startMain := func() error {
		cmd, err := s.command(commandSpec{argv: spec.argv})
		if err != nil {
			return err
		}
		s.procs.Table.Remove(process.MainID) // a restart replaces the previous run
		p, err := s.startBackground(process.MainID, cmd, false, 0, "", tee)
		if err != nil {
			return err
		}
		mainProc, mainDone = p, p.Done
		s.log.Info("main process started", "pid", p.PID, "cmd", spec.argv, "restart_policy", spec.restartPolicy)
		return nil
	}
	if len(main) > 0 {
		spec = mainSpec{argv: main, restartPolicy: s.cfg.RestartPolicy}
		if err := startMain(); err != nil {
			return 127, err
		}
	}

	serveErr := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { serveErr <- s.Serve(ctx, l) }()
	}

	shutdown := func() {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
		defer scancel()
		s.Shutdown(sctx)
	}
	code := 0
	for mainDone == nil {
		// A hot sandbox learns its main command when it is assigned.
		select {
		case spec = <-s.assignMain:
			if err := startMain(); err != nil {
				s.log.Error("assigned main command", "err", err)
				shutdown()
				return 127, err
			}
			continue
		case sig := <-stop:
			s.log.Info("stopping", "signal", sig.String())
			shutdown()
			return 0, nil
		case <-ctx.Done():
			shutdown()
			return 0, nil
		case err := <-serveErr:
			shutdown()
			if err != nil {
				return 1, err
			}
			return 1, errors.New("listener closed")
		}
	}
	restarts := 0
	for {
		select {
		case <-mainDone:
			info := processInfo(mainProc)
			if info.ExitCode != nil {
				code = *info.ExitCode
			}
			s.log.Info("main process exited", "code", code, "signal", info.Signal)
			if !restartWanted(spec.restartPolicy, code) {
				shutdown()
				return code, nil
			}
			restarts++
			delay := restartDelay(restarts, s.cfg.Now().Sub(mainProc.Started))
			s.log.Info("restarting the main process", "policy", spec.restartPolicy, "restarts", restarts, "in", delay)
			select {
			case <-time.After(delay):
			case sig := <-stop:
				s.log.Info("stopping", "signal", sig.String())
				shutdown()
				return code, nil
			case <-ctx.Done():
				shutdown()
				return code, nil
			}
			s.mainRestarts.Add(1)
			if err := startMain(); err != nil {
				// As a container that cannot start: the sandbox ends.
				s.log.Error("restart the main process", "err", err)
				shutdown()
				return 127, err
			}
		case sig := <-stop:
			s.log.Info("stopping", "signal", sig.String())
			shutdown()
			select {
			case <-mainDone:
				if info := processInfo(mainProc); info.ExitCode != nil {
					code = *info.ExitCode
				}
			case <-time.After(grace):
			}
			return code, nil
		case <-ctx.Done():
			shutdown()
			return code, nil
		case err := <-serveErr:
			shutdown()
			if err != nil {
				return 1, err
			}
			return 1, errors.New("listener closed")
		}
	}
}
