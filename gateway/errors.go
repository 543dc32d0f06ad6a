package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/containerd/errdefs"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// apiError is the body of every error answer, as E2B's API writes it:
// {"code":404,"message":"..."} (plus error_code, a semantic code, on some
// create failures). The SDK reads .code from the body, not only the HTTP
// status: kill treats code 404 as "not found" and returns false
// (dist/index.js SandboxApi.kill).
type apiError struct {
	Code      int    `json:"code"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
}

// Semantic error codes E2B's API sets in error_code (index.d.ts, schema
// Error).
const (
	codeCapacityUnavailable = "sandbox_capacity_unavailable"
	codePlacementTimeout    = "sandbox_placement_timeout"
	codeCreateFailed        = "sandbox_create_failed"
)

// codedError carries E2B's semantic error_code with an error.
type codedError struct {
	code string
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

func withCode(code string, err error) error { return &codedError{code: code, err: err} }

// errorf wraps an error class with a message: errorf(errdefs.ErrNotFound,
// "sandbox %s", id).
func errorf(class error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), class)
}

// httpStatus translates an error class to the status E2B's API answers.
func httpStatus(err error) int {
	switch {
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest
	case errdefs.IsUnauthorized(err):
		return http.StatusUnauthorized
	case errdefs.IsPermissionDenied(err):
		return http.StatusForbidden
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsConflict(err), errdefs.IsAlreadyExists(err):
		return http.StatusConflict
	case errdefs.IsResourceExhausted(err):
		return http.StatusTooManyRequests
	case errdefs.IsNotImplemented(err):
		return http.StatusNotImplemented
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// message is what the client reads: the error without the class name the
// wrapping appended (": not found"), which the status already says.
func message(err error) string {
	msg := err.Error()
	for _, class := range []error{errdefs.ErrInvalidArgument, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied,
		errdefs.ErrNotFound, errdefs.ErrConflict, errdefs.ErrAlreadyExists, errdefs.ErrResourceExhausted,
		errdefs.ErrNotImplemented, errdefs.ErrUnavailable, errdefs.ErrInternal} {
		suffix := ": " + class.Error()
		if m, ok := strings.CutSuffix(msg, suffix); ok && m != "" {
			return m
		}
	}
	return msg
}

func writeError(w http.ResponseWriter, err error) {
	status := httpStatus(err)
	body := apiError{Code: status, Message: message(err)}
	var ce *codedError
	if errors.As(err, &ce) {
		body.ErrorCode = ce.code
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// kubeError translates an apiserver error into the gateway's classes: a
// missing pod is a missing sandbox, a refused spec a bad request, an
// exhausted quota E2B's 429 (the SDK's RateLimitError), an apiserver that
// is not answering 503.
func kubeError(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return errorf(errdefs.ErrNotFound, "%s", what)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return errorf(errdefs.ErrInvalidArgument, "%s: %v", what, apiMessage(err))
	case apierrors.IsForbidden(err) && isQuota(err):
		return errorf(errdefs.ErrResourceExhausted, "%s: %v", what, apiMessage(err))
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsTimeout(err):
		return errorf(errdefs.ErrUnavailable, "%s: the Kubernetes API is busy: %v", what, apiMessage(err))
	case apierrors.IsConflict(err):
		return errorf(errdefs.ErrConflict, "%s: %v", what, apiMessage(err))
	}
	return fmt.Errorf("%s: %w", what, err)
}

func apiMessage(err error) string {
	var s apierrors.APIStatus
	if errors.As(err, &s) && s.Status().Message != "" {
		return s.Status().Message
	}
	return err.Error()
}

func isQuota(err error) bool {
	var s apierrors.APIStatus
	if !errors.As(err, &s) {
		return false
	}
	return strings.Contains(strings.ToLower(s.Status().Message), "exceeded quota")
}
