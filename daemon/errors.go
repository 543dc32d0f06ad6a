package daemon

import (
	"errors"
	"io/fs"
	"net/http"
	"os/exec"
	"syscall"

	"github.com/sandman-dev/sandman/daemon/api"
)

// classify maps an error from the OS to an API error. Messages keep the
// operation and path that failed.
func classify(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	msg := err.Error()
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, exec.ErrNotFound):
		return &apiError{http.StatusNotFound, api.CodeNotFound, msg}
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return &apiError{http.StatusForbidden, api.CodeForbidden, msg}
	case errors.Is(err, syscall.ENOTDIR):
		return &apiError{http.StatusBadRequest, api.CodeNotADirectory, msg}
	case errors.Is(err, syscall.EISDIR):
		return &apiError{http.StatusBadRequest, api.CodeIsADirectory, msg}
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return &apiError{http.StatusConflict, api.CodeConflict, msg}
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &apiError{http.StatusInsufficientStorage, api.CodeNoSpace, msg + " (the sandbox's disk is full)"}
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.ENOMEM):
		return &apiError{http.StatusTooManyRequests, api.CodeTooManyRequests, msg + " (the sandbox's process or memory limit)"}
	case errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ELOOP):
		return &apiError{http.StatusBadRequest, api.CodeBadRequest, msg}
	}
	return &apiError{http.StatusInternalServerError, api.CodeInternal, msg}
}
