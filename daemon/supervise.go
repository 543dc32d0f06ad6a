package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Supervise is the daemon's life as PID 1 of a sandbox. It serves the API on
// every listener, runs main (the pod's command, if any) as the main process
// whose output is kept for logs and copied to the daemon's own stdout and
// stderr, and returns the code the daemon should exit with:
//   - when main exits: its exit code, after the other process groups got
//     TERM and up to grace to go;
//   - on SIGTERM or SIGINT: TERM goes to every process group the daemon
//     started, KILL after grace; the code is main's if it ended, else 0;
//   - when ctx ends: as on SIGTERM.
func (s *Server) Supervise(ctx context.Context, listeners []net.Listener, main []string, grace time.Duration) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(stop)

	var mainDone <-chan struct{}
	var mainProc *process
	tee := func(stream string, b []byte) {
		if stream == "stderr" {
			_, _ = os.Stderr.Write(b)
		} else {
			_, _ = os.Stdout.Write(b)
		}
	}
	if len(main) > 0 {
		cmd, err := s.command(commandSpec{argv: main})
		if err != nil {
			return 127, err
		}
		p, err := s.startBackground("main", cmd, false, 0, "", tee)
		if err != nil {
			return 127, err
		}
		mainProc, mainDone = p, p.done
		s.log.Info("main process started", "pid", p.pid, "cmd", main)
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
		case argv := <-s.assignMain:
			cmd, err := s.command(commandSpec{argv: argv})
			if err != nil {
				s.log.Error("assigned main command", "err", err)
				shutdown()
				return 127, err
			}
			p, err := s.startBackground("main", cmd, false, 0, "", tee)
			if err != nil {
				shutdown()
				return 127, err
			}
			mainProc, mainDone = p, p.done
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
	select {
	case <-mainDone:
		info := mainProc.info()
		if info.ExitCode != nil {
			code = *info.ExitCode
		}
		s.log.Info("main process exited", "code", code, "signal", info.Signal)
		shutdown()
	case sig := <-stop:
		s.log.Info("stopping", "signal", sig.String())
		shutdown()
		if mainProc != nil {
			select {
			case <-mainDone:
				if info := mainProc.info(); info.ExitCode != nil {
					code = *info.ExitCode
				}
			case <-time.After(grace):
			}
		}
	case <-ctx.Done():
		shutdown()
	case err := <-serveErr:
		shutdown()
		if err != nil {
			return 1, err
		}
		return 1, errors.New("listener closed")
	}
	return code, nil
}
