package envd

import (
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/oserr"
	"github.com/sandman-dev/sandman/daemon/internal/process"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// apiCoded is an error of the daemon's own with its v1 API code (from code
// envd shares with the v1 API, such as a command's checks).
type apiCoded interface {
	error
	APICode() string
}

// asConnectError turns an error into a Connect error. Connect errors pass
// as they are; the daemon's own errors (from code envd shares with the v1
// API, such as a command's checks) keep the class of their API code; an
// error of the OS gets the code of its class (oserr), with the limit it ran
// into and what to do added to its text.
func asConnectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case errors.Is(err, sandboxuser.ErrUnknown):
		return connect.NewError(connect.CodeUnauthenticated, err)
	case errors.Is(err, sandboxuser.ErrMalformed):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, process.ErrNoSlot):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, process.ErrShuttingDown):
		return connect.NewError(connect.CodeUnavailable, err)
	}
	var ae apiCoded
	if errors.As(err, &ae) {
		return connect.NewError(apiConnectCode(ae.APICode()), errors.New(ae.Error()))
	}
	c := oserr.Of(err)
	if l := c.Limit(); l != "" {
		err = fmt.Errorf("%w (%s)", err, l)
	}
	return connect.NewError(connectCode(c), oserr.Explain(err))
}

// connectCode is the Connect code of a class of OS errors. (E2B's SDKs
// raise their own error types for InvalidArgument, Unauthenticated,
// NotFound and the timeouts, and SandboxError for the rest.)
func connectCode(c oserr.Class) connect.Code {
	switch c {
	case oserr.NotFound:
		return connect.CodeNotFound
	case oserr.Exists:
		return connect.CodeAlreadyExists
	case oserr.Permission:
		return connect.CodePermissionDenied
	case oserr.NotADirectory, oserr.IsADirectory, oserr.NotEmpty, oserr.CrossDevice, oserr.Loop, oserr.Busy:
		return connect.CodeFailedPrecondition
	case oserr.Invalid:
		return connect.CodeInvalidArgument
	case oserr.NoSpace, oserr.Exhausted:
		return connect.CodeResourceExhausted
	}
	return connect.CodeInternal
}

// apiConnectCode is the Connect code of a v1 API error code.
func apiConnectCode(code string) connect.Code {
	switch code {
	case api.CodeBadRequest, api.CodeNotADirectory, api.CodeIsADirectory:
		return connect.CodeInvalidArgument
	case api.CodeUnauthorized:
		return connect.CodeUnauthenticated
	case api.CodeForbidden:
		return connect.CodePermissionDenied
	case api.CodeNotFound:
		return connect.CodeNotFound
	case api.CodeConflict, api.CodeNoShell:
		return connect.CodeFailedPrecondition
	case api.CodeTooLarge, api.CodeTooManyRequests, api.CodeNoSpace:
		return connect.CodeResourceExhausted
	case api.CodeUnavailable:
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// restStatus is the HTTP status for an error of a /files call: the
// status of its class (oserr), as the v1 API answers it.
func restStatus(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, errUploadTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errBadBody), errors.Is(err, errMetadataUnsupported):
		return http.StatusBadRequest
	}
	return oserr.Of(err).HTTPStatus()
}
