package oserr

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		err    error
		class  Class
		status int
	}{
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, NotFound, http.StatusNotFound},
		{fmt.Errorf("start: %w", exec.ErrNotFound), NotFound, http.StatusNotFound},
		{syscall.EACCES, Permission, http.StatusForbidden},
		{syscall.EPERM, Permission, http.StatusForbidden},
		{syscall.EROFS, Permission, http.StatusForbidden},
		{syscall.ENOTDIR, NotADirectory, http.StatusBadRequest},
		{syscall.EISDIR, IsADirectory, http.StatusBadRequest},
		{syscall.EEXIST, Exists, http.StatusConflict},
		{syscall.ENOTEMPTY, NotEmpty, http.StatusConflict},
		{syscall.EXDEV, CrossDevice, http.StatusInternalServerError},
		{syscall.EBUSY, Busy, http.StatusInternalServerError},
		{syscall.EINVAL, Invalid, http.StatusBadRequest},
		{syscall.ENAMETOOLONG, Invalid, http.StatusBadRequest},
		{syscall.ELOOP, Loop, http.StatusBadRequest},
		{syscall.ENOSPC, NoSpace, http.StatusInsufficientStorage},
		{syscall.EDQUOT, NoSpace, http.StatusInsufficientStorage},
		// A fork under the pids limit, and memory: one class, 429, in every protocol.
		{&exec.Error{Name: "sh", Err: syscall.EAGAIN}, Exhausted, http.StatusTooManyRequests},
		{syscall.ENOMEM, Exhausted, http.StatusTooManyRequests},
		{syscall.EMFILE, Other, http.StatusInternalServerError},
		{errors.New("no errno"), Other, http.StatusInternalServerError},
		{nil, Other, http.StatusInternalServerError},
	} {
		t.Run(fmt.Sprint(tc.err), func(t *testing.T) {
			c := Of(tc.err)
			if c != tc.class {
				t.Errorf("Of = %d, want %d", c, tc.class)
			}
			if got := c.HTTPStatus(); got != tc.status {
				t.Errorf("HTTPStatus = %d, want %d", got, tc.status)
			}
		})
	}
}

func TestExplain(t *testing.T) {
	for _, tc := range []struct {
		err  error
		says string
	}{
		{syscall.ENOTDIR, "is a file, not a directory"},
		{syscall.EXDEV, "copy and remove instead"},
		{syscall.ELOOP, "a loop?"},
		{syscall.ENOENT, ""},
	} {
		got := Explain(tc.err)
		if !errors.Is(got, tc.err) {
			t.Errorf("Explain(%v) = %v: lost the errno", tc.err, got)
		}
		if want := tc.err.Error(); tc.says == "" && got.Error() != want {
			t.Errorf("Explain(%v) = %q, want it unchanged", tc.err, got)
		} else if tc.says != "" && !strings.Contains(got.Error(), tc.says) {
			t.Errorf("Explain(%v) = %q, want it to say %q", tc.err, got, tc.says)
		}
	}
}
