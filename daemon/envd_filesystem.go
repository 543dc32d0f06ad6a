package daemon

import "github.com/sandman-dev/sandman/daemon/envd/spec/filesystem/filesystemconnect"

// envdFilesystem serves envd's filesystem service.
type envdFilesystem struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server
}
