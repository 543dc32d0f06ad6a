package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/api"
)

// TestErrorMappers: one OS error reads as the same class in the v1 API,
// envd's Connect services and envd's REST paths.
func TestErrorMappers(t *testing.T) {
	for _, tc := range []struct {
		errno   syscall.Errno
		status  int // v1 and REST
		code    string
		connect connect.Code
		says    string
	}{
		{syscall.ENOENT, http.StatusNotFound, api.CodeNotFound, connect.CodeNotFound, ""},
		{syscall.EACCES, http.StatusForbidden, api.CodeForbidden, connect.CodePermissionDenied, ""},
		{syscall.EROFS, http.StatusForbidden, api.CodeForbidden, connect.CodePermissionDenied, ""},
		{syscall.ENOTDIR, http.StatusBadRequest, api.CodeNotADirectory, connect.CodeFailedPrecondition, ""},
		{syscall.EEXIST, http.StatusConflict, api.CodeConflict, connect.CodeAlreadyExists, ""},
		{syscall.EINVAL, http.StatusBadRequest, api.CodeBadRequest, connect.CodeInvalidArgument, ""},
		{syscall.ENOSPC, http.StatusInsufficientStorage, api.CodeNoSpace, connect.CodeResourceExhausted, "disk is full"},
		// Once 429 in v1 but Internal in envd: a fork refused under the
		// pids limit is the sandbox's limit in every protocol.
		{syscall.EAGAIN, http.StatusTooManyRequests, api.CodeTooManyRequests, connect.CodeResourceExhausted, "process or memory limit"},
		{syscall.ENOMEM, http.StatusTooManyRequests, api.CodeTooManyRequests, connect.CodeResourceExhausted, "process or memory limit"},
		{syscall.EMFILE, http.StatusInternalServerError, api.CodeInternal, connect.CodeInternal, ""},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			err := fmt.Errorf("start /bin/sh: %w", &fs.PathError{Op: "fork", Path: "/bin/sh", Err: tc.errno})
			ae := classify(err)
			if ae.status != tc.status || ae.code != tc.code || !strings.Contains(ae.msg, tc.says) {
				t.Errorf("v1: %d %s %q, want %d %s saying %q", ae.status, ae.code, ae.msg, tc.status, tc.code, tc.says)
			}
			if got := envdRESTStatus(err); got != tc.status {
				t.Errorf("REST: %d, want %d", got, tc.status)
			}
			var ce *connect.Error
			if !errors.As(asConnectError(err), &ce) || ce.Code() != tc.connect || !strings.Contains(ce.Message(), tc.says) {
				t.Errorf("Connect: %v, want %v saying %q", ce, tc.connect, tc.says)
			}
		})
	}
}
