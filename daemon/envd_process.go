package daemon

import "github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"

// envdProcess serves envd's process service.
type envdProcess struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}
