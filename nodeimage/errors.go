package nodeimage

import (
	"errors"
	"fmt"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
)

// Kind classifies a failed Ensure.
type Kind string

const (
	// KindNotFound: the registry has no such repository or tag. Not retried.
	KindNotFound Kind = "not_found"
	// KindUnauthorized: the registry refused the credentials (or wants some).
	// Not retried: the pod's pull secret must change.
	KindUnauthorized Kind = "unauthorized"
	// KindUnreachable: the registry did not answer (DNS, connection, TLS,
	// 5xx). Retried with backoff.
	KindUnreachable Kind = "unreachable"
	// KindRuntimeUnavailable: the node's containerd did not answer (it
	// restarted, say), not the registry. Retried with backoff; the pool
	// places the pod elsewhere or later.
	KindRuntimeUnavailable Kind = "runtime_unavailable"
	// KindDiskFull: the node ran out of disk while storing or unpacking.
	// Retried once after garbage collection.
	KindDiskFull Kind = "disk_full"
	// KindInvalid: the reference cannot be parsed. Not retried.
	KindInvalid Kind = "invalid"
	// KindForbidden: the node refuses the image to this pod whatever the
	// registry would say: another namespace's snapshot
	// (SnapshotRepositories), an image in the pool's convert repository.
	// Not retried: the pod must name another image.
	KindForbidden Kind = "forbidden"
	// KindFailed: anything else.
	KindFailed Kind = "failed"
)

// Error is a failed Ensure: which image, what kind of failure, and the
// registry's (or containerd's) own message.
type Error struct {
	Image string
	Kind  Kind
	Err   error
}

func (e *Error) Error() string {
	what := map[Kind]string{
		KindNotFound:           "not found in the registry",
		KindUnauthorized:       "pull refused by the registry (check the pod's imagePullSecrets)",
		KindUnreachable:        "registry unreachable",
		KindDiskFull:           "node disk full while pulling",
		KindRuntimeUnavailable: "the node's containerd did not answer (not the registry)",
		KindInvalid:            "not a valid image reference",
		KindForbidden:          "refused on this node",
		KindFailed:             "pull failed",
	}[e.Kind]
	return fmt.Sprintf("image %s: %s: %v", e.Image, what, e.Err)
}

// Unwrap gives the errdefs class, so callers that only know errdefs (the
// node API, the pool) classify it, and the cause.
func (e *Error) Unwrap() []error {
	class := map[Kind]error{
		KindNotFound:           errdefs.ErrNotFound,
		KindUnauthorized:       errdefs.ErrUnauthenticated,
		KindUnreachable:        errdefs.ErrUnavailable,
		KindDiskFull:           errdefs.ErrResourceExhausted,
		KindRuntimeUnavailable: errdefs.ErrUnavailable,
		KindInvalid:            errdefs.ErrInvalidArgument,
		KindForbidden:          errdefs.ErrPermissionDenied,
		KindFailed:             errdefs.ErrUnknown,
	}[e.Kind]
	return []error{class, e.Err}
}

// Retryable says whether trying again can help.
func (e *Error) Retryable() bool {
	return e.Kind == KindUnreachable || e.Kind == KindDiskFull || e.Kind == KindRuntimeUnavailable
}

// KindOf returns err's kind, or "" when err is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// classify turns a pull error into an *Error.
func classify(image string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Image: image, Kind: kindOf(err), Err: err}
}

// Classify tells the kind of a failure to talk to a registry or to store
// an image (a push, say): the classes a failed pull gets.
func Classify(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return kindOf(err)
}

func kindOf(err error) Kind {
	var status remoteerrors.ErrUnexpectedStatus
	var netErr net.Error
	msg := err.Error()
	switch {
	case runtimeUnavailable(err):
		return KindRuntimeUnavailable
	case errors.Is(err, syscall.ENOSPC) || strings.Contains(msg, "no space left on device"),
		errors.Is(err, syscall.EDQUOT) || strings.Contains(msg, "disk quota exceeded"):
		return KindDiskFull
	case errors.Is(err, docker.ErrInvalidAuthorization):
		return KindUnauthorized
	case errors.As(err, &status):
		switch {
		case status.StatusCode == http.StatusUnauthorized || status.StatusCode == http.StatusForbidden:
			return KindUnauthorized
		case status.StatusCode == http.StatusNotFound:
			return KindNotFound
		case status.StatusCode == http.StatusTooManyRequests || status.StatusCode >= 500:
			return KindUnreachable
		}
		return KindFailed
	case errdefs.IsNotFound(err):
		return KindNotFound
	case errors.As(err, &netErr), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		strings.Contains(msg, "connection refused"), strings.Contains(msg, "no such host"),
		strings.Contains(msg, "i/o timeout"), strings.Contains(msg, "tls:"), strings.Contains(msg, "x509:"):
		return KindUnreachable
	}
	return KindFailed
}

// runtimeUnavailable: the gRPC connection to containerd failed (refused,
// reset, closed), as opposed to containerd reporting a registry's failure.
func runtimeUnavailable(err error) bool {
	st, ok := grpcstatus.FromError(err)
	if !ok {
		// containerd's client turns statuses into errdefs errors that keep
		// the message.
		if !errdefs.IsUnavailable(err) {
			return false
		}
	} else if st.Code() != codes.Unavailable {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "transport: Error while dialing") || strings.Contains(msg, "error reading from server") ||
		strings.Contains(msg, "transport is closing") || strings.Contains(msg, "connection closed before server preface")
}
