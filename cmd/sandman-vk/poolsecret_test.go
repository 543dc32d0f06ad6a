package main

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func poolSecret(data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "sandman-system", Name: "pool"}, Data: data}
}

func TestEnsurePoolSecret(t *testing.T) {
	secretsGR := schema.GroupResource{Resource: "secrets"}
	for _, tc := range []struct {
		name     string
		existing *corev1.Secret
		setup    func(*kfake.Clientset)
		want     string // the token; "new" for a freshly made one
		wantErr  string
	}{
		{name: "created when missing", want: "new"},
		{name: "existing token", existing: poolSecret(map[string][]byte{"token": []byte("abc\n")}), want: "abc"},
		{name: "no token key", existing: poolSecret(map[string][]byte{"other": []byte("x")}), wantErr: `no non-empty "token" key`},
		{name: "empty token", existing: poolSecret(map[string][]byte{"token": []byte(" ")}), wantErr: `no non-empty "token" key`},
		{name: "another replica wins the race", setup: func(c *kfake.Clientset) {
			c.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, kruntime.Object, error) {
				if err := c.Tracker().Add(poolSecret(map[string][]byte{"token": []byte("winner")})); err != nil {
					return true, nil, err
				}
				return true, nil, apierrors.NewAlreadyExists(secretsGR, "pool")
			})
		}, want: "winner"},
		{name: "forbidden", setup: func(c *kfake.Clientset) {
			c.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, kruntime.Object, error) {
				return true, nil, apierrors.NewForbidden(secretsGR, "pool", errors.New("RBAC"))
			})
		}, wantErr: "needs get and create on secrets in namespace sandman-system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := kfake.NewClientset()
			if tc.existing != nil {
				if err := c.Tracker().Add(tc.existing); err != nil {
					t.Fatal(err)
				}
			}
			if tc.setup != nil {
				tc.setup(c)
			}
			got, err := ensurePoolSecret(t.Context(), c, "sandman-system", "pool")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "new" {
				if got != tc.want {
					t.Fatalf("token %q, want %q", got, tc.want)
				}
				return
			}
			if b, err := hex.DecodeString(got); err != nil || len(b) != 32 {
				t.Fatalf("new token %q is not 32 hex-encoded bytes", got)
			}
			s, err := c.CoreV1().Secrets("sandman-system").Get(t.Context(), "pool", metav1.GetOptions{})
			switch {
			case err != nil:
				t.Fatal(err)
			case string(s.Data["token"]) != got:
				t.Fatalf("stored token %q, returned %q", s.Data["token"], got)
			case s.Type != corev1.SecretTypeOpaque, s.Labels["app.kubernetes.io/part-of"] != "sandman":
				t.Fatalf("secret type %q labels %v", s.Type, s.Labels)
			}
			// A second start reads the same token.
			again, err := ensurePoolSecret(t.Context(), c, "sandman-system", "pool")
			if err != nil || again != got {
				t.Fatalf("second start: %q, %v; want %q", again, err, got)
			}
		})
	}
}

func TestParseSecretName(t *testing.T) {
	for _, tc := range []struct {
		in       string
		ns, name string
		ok       bool
	}{
		{"sandman-system/pool", "sandman-system", "pool", true},
		{"pool", "", "", false},
		{"/pool", "", "", false},
		{"ns/", "", "", false},
		{"a/b/c", "", "", false},
	} {
		ns, name, err := parseSecretName(tc.in)
		if (err == nil) != tc.ok || ns != tc.ns || name != tc.name {
			t.Errorf("parseSecretName(%q) = %q, %q, %v", tc.in, ns, name, err)
		}
	}
}
