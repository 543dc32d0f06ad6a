package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/containerd/errdefs"
)

// Error codes of the virtual node's routes, one per errdefs class: the
// Code of a SnapshotLine, the class of an Error.
const (
	CodeNotFound           = "not_found"
	CodeInvalidArgument    = "invalid_argument"
	CodeFailedPrecondition = "failed_precondition"
	CodeAlreadyExists      = "already_exists"
	CodeNotImplemented     = "not_implemented"
	CodeUnauthenticated    = "unauthenticated"
	CodePermissionDenied   = "permission_denied"
	CodeUnavailable        = "unavailable"
	CodeResourceExhausted  = "resource_exhausted"
	CodeCanceled           = "canceled"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeInternal           = "internal"
)

// CauseCode is the cause type under which a refusal's Kubernetes Status
// carries the code (details.causes[].message).
const CauseCode = "sandman.io/code"

var codeClass = map[string]error{
	CodeNotFound:           errdefs.ErrNotFound,
	CodeInvalidArgument:    errdefs.ErrInvalidArgument,
	CodeFailedPrecondition: errdefs.ErrFailedPrecondition,
	CodeAlreadyExists:      errdefs.ErrAlreadyExists,
	CodeNotImplemented:     errdefs.ErrNotImplemented,
	CodeUnauthenticated:    errdefs.ErrUnauthenticated,
	CodePermissionDenied:   errdefs.ErrPermissionDenied,
	CodeUnavailable:        errdefs.ErrUnavailable,
	CodeResourceExhausted:  errdefs.ErrResourceExhausted,
	CodeCanceled:           context.Canceled,
	CodeDeadlineExceeded:   context.DeadlineExceeded,
	CodeInternal:           errdefs.ErrInternal,
}

// ErrorCode is err's code: its errdefs class (context errors count as
// canceled and deadline_exceeded), internal when it has none.
func ErrorCode(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return CodeDeadlineExceeded
	case errdefs.IsNotFound(err):
		return CodeNotFound
	case errdefs.IsInvalidArgument(err):
		return CodeInvalidArgument
	case errdefs.IsFailedPrecondition(err):
		return CodeFailedPrecondition
	case errdefs.IsAlreadyExists(err):
		return CodeAlreadyExists
	case errdefs.IsNotImplemented(err):
		return CodeNotImplemented
	case errdefs.IsUnauthorized(err):
		return CodeUnauthenticated
	case errdefs.IsPermissionDenied(err):
		return CodePermissionDenied
	case errdefs.IsUnavailable(err):
		return CodeUnavailable
	case errdefs.IsResourceExhausted(err):
		return CodeResourceExhausted
	case errdefs.IsCanceled(err):
		return CodeCanceled
	case errdefs.IsDeadlineExceeded(err):
		return CodeDeadlineExceeded
	}
	return CodeInternal
}

// HTTPStatus is the status a call refused with code is answered with
// before its stream begins. A registry's refusal of a push
// (unauthenticated, permission_denied) is 502: the caller's own
// credentials were fine.
func HTTPStatus(code string) int {
	switch code {
	case CodeNotFound:
		return http.StatusNotFound
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeFailedPrecondition, CodeAlreadyExists:
		return http.StatusConflict
	case CodeNotImplemented:
		return http.StatusNotImplemented
	case CodeUnauthenticated, CodePermissionDenied:
		return http.StatusBadGateway
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeResourceExhausted:
		return http.StatusInsufficientStorage
	case CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// CodeOfStatus is the code of an HTTP error status, as a client reads a
// call refused before its stream (by the virtual node, the kubelet port's
// authorization or the apiserver).
func CodeOfStatus(status int) string {
	switch status {
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return CodeInvalidArgument
	case http.StatusConflict:
		return CodeFailedPrecondition
	case http.StatusNotImplemented:
		return CodeNotImplemented
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return CodeUnavailable
	case http.StatusInsufficientStorage, http.StatusTooManyRequests:
		return CodeResourceExhausted
	case http.StatusGatewayTimeout:
		return CodeDeadlineExceeded
	}
	return CodeInternal
}

// Error is a call of the virtual node's API that failed: errors.Is(err,
// errdefs.ErrNotFound) and the like test its class.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap is the errdefs class of e's Code.
func (e *Error) Unwrap() error {
	if c, ok := codeClass[e.Code]; ok {
		return c
	}
	return errdefs.ErrInternal
}
