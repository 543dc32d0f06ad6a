package daemon

import (
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/sandman-dev/sandman/daemon/api"
)

// TestClassify: an OS error reads as its class in the v1 API, as in
// envd's Connect services and REST paths (envd's TestErrorMappers holds the
// same table).
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		errno  syscall.Errno
		status int
		code   string
		says   string
	}{
		{syscall.ENOENT, http.StatusNotFound, api.CodeNotFound, ""},
		{syscall.EACCES, http.StatusForbidden, api.CodeForbidden, ""},
		{syscall.EROFS, http.StatusForbidden, api.CodeForbidden, ""},
		{syscall.ENOTDIR, http.StatusBadRequest, api.CodeNotADirectory, ""},
		{syscall.EEXIST, http.StatusConflict, api.CodeConflict, ""},
		{syscall.EINVAL, http.StatusBadRequest, api.CodeBadRequest, ""},
		{syscall.ENOSPC, http.StatusInsufficientStorage, api.CodeNoSpace, "disk is full"},
		// A fork refused under the pids limit is the sandbox's limit, in
		// every protocol (envd's once said Internal).
		{syscall.EAGAIN, http.StatusTooManyRequests, api.CodeTooManyRequests, "process or memory limit"},
		{syscall.ENOMEM, http.StatusTooManyRequests, api.CodeTooManyRequests, "process or memory limit"},
		{syscall.EMFILE, http.StatusInternalServerError, api.CodeInternal, ""},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			err := fmt.Errorf("start /bin/sh: %w", &fs.PathError{Op: "fork", Path: "/bin/sh", Err: tc.errno})
			ae := classify(err)
			if ae.status != tc.status || ae.code != tc.code || !strings.Contains(ae.msg, tc.says) {
				t.Errorf("v1: %d %s %q, want %d %s saying %q", ae.status, ae.code, ae.msg, tc.status, tc.code, tc.says)
			}
		})
	}
}
