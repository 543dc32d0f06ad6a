package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"
)

// TestErrorMappers: an OS error reads as its class in envd's Connect
// services and REST paths, as in the v1 API (the daemon's
// TestClassify holds the same table).
func TestErrorMappers(t *testing.T) {
	for _, tc := range []struct {
		errno   syscall.Errno
		status  int // REST, as v1
		connect connect.Code
		says    string
	}{
		{syscall.ENOENT, http.StatusNotFound, connect.CodeNotFound, ""},
		{syscall.EACCES, http.StatusForbidden, connect.CodePermissionDenied, ""},
		{syscall.EROFS, http.StatusForbidden, connect.CodePermissionDenied, ""},
		{syscall.ENOTDIR, http.StatusBadRequest, connect.CodeFailedPrecondition, ""},
		{syscall.EEXIST, http.StatusConflict, connect.CodeAlreadyExists, ""},
		{syscall.EINVAL, http.StatusBadRequest, connect.CodeInvalidArgument, ""},
		{syscall.ENOSPC, http.StatusInsufficientStorage, connect.CodeResourceExhausted, "disk is full"},
		// Once 429 in v1 but Internal in envd: a fork refused under the
		// pids limit is the sandbox's limit in every protocol.
		{syscall.EAGAIN, http.StatusTooManyRequests, connect.CodeResourceExhausted, "process or memory limit"},
		{syscall.ENOMEM, http.StatusTooManyRequests, connect.CodeResourceExhausted, "process or memory limit"},
		{syscall.EMFILE, http.StatusInternalServerError, connect.CodeInternal, ""},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			err := fmt.Errorf("start /bin/sh: %w", &fs.PathError{Op: "fork", Path: "/bin/sh", Err: tc.errno})
			if got := restStatus(err); got != tc.status {
				t.Errorf("REST: %d, want %d", got, tc.status)
			}
			var ce *connect.Error
			if !errors.As(asConnectError(err), &ce) || ce.Code() != tc.connect || !strings.Contains(ce.Message(), tc.says) {
				t.Errorf("Connect: %v, want %v saying %q", ce, tc.connect, tc.says)
			}
		})
	}
}
