package daemon

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/oserr"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// classify maps an error from the OS to a v1 API error: the HTTP status of
// its class (oserr) and the class's API code. Messages keep the operation
// and path that failed, and name the sandbox limit the error ran into.
func classify(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	switch {
	case errors.Is(err, process.ErrNoSlot):
		return &apiError{http.StatusTooManyRequests, api.CodeTooManyRequests, err.Error()}
	case errors.Is(err, process.ErrShuttingDown):
		return &apiError{http.StatusServiceUnavailable, api.CodeUnavailable, err.Error()}
	}
	c := oserr.Of(err)
	msg := err.Error()
	if l := c.Limit(); l != "" {
		msg = fmt.Sprintf("%s (%s)", msg, l)
	}
	return &apiError{c.HTTPStatus(), v1Code(c), msg}
}

// v1Code is the v1 API's error code for a class of OS errors.
func v1Code(c oserr.Class) string {
	switch c {
	case oserr.NotFound:
		return api.CodeNotFound
	case oserr.Permission:
		return api.CodeForbidden
	case oserr.NotADirectory:
		return api.CodeNotADirectory
	case oserr.IsADirectory:
		return api.CodeIsADirectory
	case oserr.Exists, oserr.NotEmpty:
		return api.CodeConflict
	case oserr.NoSpace:
		return api.CodeNoSpace
	case oserr.Exhausted:
		return api.CodeTooManyRequests
	case oserr.Invalid, oserr.Loop:
		return api.CodeBadRequest
	}
	return api.CodeInternal
}
