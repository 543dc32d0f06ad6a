package nodeimage

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind Kind
	}{
		{fmt.Errorf("reg/x:1: %w", errdefs.ErrNotFound), KindNotFound},
		{fmt.Errorf("pull access denied: %w", docker.ErrInvalidAuthorization), KindUnauthorized},
		{remoteerrors.ErrUnexpectedStatus{StatusCode: 401, Status: "401 Unauthorized"}, KindUnauthorized},
		{remoteerrors.ErrUnexpectedStatus{StatusCode: 403, Status: "403 Forbidden"}, KindUnauthorized},
		{remoteerrors.ErrUnexpectedStatus{StatusCode: 503, Status: "503 Service Unavailable"}, KindUnreachable},
		{remoteerrors.ErrUnexpectedStatus{StatusCode: 400, Status: "400 Bad Request"}, KindFailed},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, KindUnreachable},
		{errors.New("failed to do request: dial tcp: lookup reg.invalid: no such host"), KindUnreachable},
		{fmt.Errorf("write /var/lib/containerd/x: %w", syscall.ENOSPC), KindDiskFull},
		{errors.New("rpc error: code = Unknown desc = failed to extract layer: write /x: no space left on device"), KindDiskFull},
		{errors.New("something else"), KindFailed},
		// containerd itself away (restarting), as its client reports it.
		{grpcstatus.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial unix /run/containerd/containerd.sock: connect: connection refused"`), KindRuntimeUnavailable},
		{fmt.Errorf("pull: %w", errgrpc.ToNative(grpcstatus.Error(codes.Unavailable, "error reading from server: connection reset by peer"))), KindRuntimeUnavailable},
		// A registry failure containerd reports is not containerd's.
		{grpcstatus.Error(codes.Unavailable, "failed to resolve reference: dial tcp 10.0.0.1:443: connect: connection refused"), KindUnreachable},
	} {
		e := classify("reg/x:1", tc.err)
		if e.Kind != tc.kind {
			t.Errorf("%v: kind %s, want %s", tc.err, e.Kind, tc.kind)
		}
		if e.Err == nil || e.Err.Error() != tc.err.Error() {
			t.Errorf("%v: the cause is not kept", tc.err)
		}
	}
}

func TestErrorClasses(t *testing.T) {
	cause := errors.New("manifest unknown")
	for kind, is := range map[Kind]func(error) bool{
		KindNotFound:           errdefs.IsNotFound,
		KindUnauthorized:       errdefs.IsUnauthorized,
		KindUnreachable:        errdefs.IsUnavailable,
		KindDiskFull:           errdefs.IsResourceExhausted,
		KindRuntimeUnavailable: errdefs.IsUnavailable,
		KindInvalid:            errdefs.IsInvalidArgument,
	} {
		err := fmt.Errorf("bind: %w", &Error{Image: "reg/x:1", Kind: kind, Err: cause})
		if !is(err) || KindOf(err) != kind || !errors.Is(err, cause) {
			t.Errorf("%s: class, kind or cause lost: %v", kind, err)
		}
	}
	if KindOf(errors.New("x")) != "" {
		t.Error("a plain error has a kind")
	}
	e := &Error{Image: "reg/x:1", Kind: KindUnauthorized, Err: errors.New("401 Unauthorized")}
	if got := e.Error(); got != "image reg/x:1: pull refused by the registry (check the pod's imagePullSecrets): 401 Unauthorized" {
		t.Errorf("message %q", got)
	}
	if e.Retryable() || !(&Error{Kind: KindUnreachable}).Retryable() {
		t.Error("retryable kinds wrong")
	}
}

func TestNormalize(t *testing.T) {
	for ref, want := range map[string]string{
		"busybox":                         "docker.io/library/busybox:latest",
		"127.0.0.1:15000/debian:bookworm": "127.0.0.1:15000/debian:bookworm",
		"reg.example/team/task@sha256:" + fmt.Sprintf("%064d", 0): "reg.example/team/task@sha256:" + fmt.Sprintf("%064d", 0),
	} {
		got, err := Normalize(ref)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	if _, err := Normalize("not a ref!"); KindOf(err) != KindInvalid {
		t.Errorf("invalid reference: %v", err)
	}
}

func TestParseDockerConfigs(t *testing.T) {
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cr:et"))
	got := parseDockerConfigs([][]byte{
		[]byte(`{"auths":{"https://index.docker.io/v1/":{"auth":"` + auth + `"},"reg.example:5000":{"username":"bob","password":"pw"}}}`),
		[]byte(`{"legacy.example":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("carol:x")) + `"}}`),
		[]byte(`not json`),
	})
	want := map[string][2]string{
		"registry-1.docker.io": {"alice", "s3cr:et"},
		"reg.example:5000":     {"bob", "pw"},
		"legacy.example":       {"carol", "x"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for h, c := range want {
		if got[h] != c {
			t.Errorf("%s: %v, want %v", h, got[h], c)
		}
	}
}
