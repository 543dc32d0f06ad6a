package main

import (
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandman-dev/sandman/vk"
)

func controlSecret(data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "sandman-system", Name: "ck"}, Data: data}
}

// keysString renders a key set as "current|prev1,prev2".
func keysString(k *vk.ControlKeys) string {
	var prev []string
	for _, p := range k.Previous() {
		prev = append(prev, string(p))
	}
	return string(k.Current()) + "|" + strings.Join(prev, ",")
}

func TestEnsureControlKeySecret(t *testing.T) {
	secretsGR := schema.GroupResource{Resource: "secrets"}
	for _, tc := range []struct {
		name     string
		existing *corev1.Secret
		setup    func(*kfake.Clientset)
		seed     string
		want     string // keysString-like: "new" for a fresh current key
		wantErr  string
	}{
		{name: "created when missing", want: "new|"},
		{name: "created with the pool token as previous", seed: "pool-token", want: "new|pool-token"},
		{name: "existing keys", existing: controlSecret(map[string][]byte{"control-key": []byte("k2\n"), "control-key-previous": []byte("k1\n\nk0\n")}),
			seed: "ignored", want: "k2|k1,k0"},
		{name: "no control-key", existing: controlSecret(map[string][]byte{"control-key-previous": []byte("k1")}), wantErr: `key "control-key" must hold one non-empty key`},
		{name: "two current keys", existing: controlSecret(map[string][]byte{"control-key": []byte("a\nb")}), wantErr: `must hold one non-empty key`},
		{name: "another replica wins the race", setup: func(c *kfake.Clientset) {
			c.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, kruntime.Object, error) {
				if err := c.Tracker().Add(controlSecret(map[string][]byte{"control-key": []byte("winner")})); err != nil {
					return true, nil, err
				}
				return true, nil, apierrors.NewAlreadyExists(secretsGR, "ck")
			})
		}, want: "winner|"},
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
			cur, prev, err := ensureControlKeySecret(t.Context(), c, "sandman-system", "ck", func() ([]byte, error) { return []byte(tc.seed), nil })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			k, err := vk.NewControlKeys(cur, prev...)
			if err != nil {
				t.Fatal(err)
			}
			got := keysString(k)
			if rest, ok := strings.CutPrefix(tc.want, "new"); ok {
				if b, err := hex.DecodeString(string(cur)); err != nil || len(b) != 32 {
					t.Fatalf("new key %q is not 32 hex-encoded bytes", cur)
				}
				if got != string(cur)+rest {
					t.Fatalf("keys %q, want the new key then %q", got, rest)
				}
				s, err := c.CoreV1().Secrets("sandman-system").Get(t.Context(), "ck", metav1.GetOptions{})
				if err != nil || string(s.Data["control-key"]) != string(cur) || s.Labels["app.kubernetes.io/part-of"] != "sandman" {
					t.Fatalf("stored secret %+v, %v", s, err)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("keys %q, want %q", got, tc.want)
			}
		})
	}
}

// TestControlKeySeedSecret: an earlier install's pool token becomes the
// previous key of a new control key Secret; without that Secret, none.
func TestControlKeySeedSecret(t *testing.T) {
	c := kfake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "sandman-system", Name: "sandman-pool"},
		Data: map[string][]byte{"token": []byte("old-pool-token\n")}})
	seed := func() ([]byte, error) { return readSeedSecret(t.Context(), c, "sandman-system", "sandman-pool") }
	cur, prev, err := ensureControlKeySecret(t.Context(), c, "sandman-system", "ck", seed)
	if err != nil || len(cur) != 64 || len(prev) != 1 || string(prev[0]) != "old-pool-token" {
		t.Fatalf("keys %q %q, %v; want a new key and the pool token as previous", cur, prev, err)
	}
	none := func() ([]byte, error) { return readSeedSecret(t.Context(), c, "sandman-system", "missing") }
	if _, prev, err := ensureControlKeySecret(t.Context(), c, "sandman-system", "ck2", none); err != nil || len(prev) != 0 {
		t.Fatalf("without a seed Secret: previous %q, %v", prev, err)
	}
}

// TestWatchControlKeySecret: a rotation in the Secret reaches the key set
// without a restart; a broken version in between does no harm.
func TestWatchControlKeySecret(t *testing.T) {
	c := kfake.NewClientset(controlSecret(map[string][]byte{"control-key": []byte("k1")}))
	keys, err := vk.NewControlKeys([]byte("k1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := watchControlKeySecret(t.Context(), c, "sandman-system", "ck", keys, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	update := func(data map[string][]byte) {
		t.Helper()
		if _, err := c.CoreV1().Secrets("sandman-system").Update(t.Context(), controlSecret(data), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	changed := keys.Changed()
	update(map[string][]byte{"control-key": []byte("k2"), "control-key-previous": []byte("k1")})
	waitFor(t, "the rotation", func() bool { return keysString(keys) == "k2|k1" })
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed by the rotation")
	}
	update(map[string][]byte{"control-key-previous": []byte("k1")})
	update(map[string][]byte{"control-key": []byte("k2")})
	waitFor(t, "the previous key removed", func() bool { return keysString(keys) == "k2|" })
}

func TestWatchControlKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control-keys")
	write := func(s string) {
		t.Helper()
		// Through a rename, as an operator's tooling (or a Secret volume)
		// replaces a file: the size or time changes.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("k1\n")
	cur, prev, err := readControlKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := vk.NewControlKeys(cur, prev...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	ctx := t.Context()
	go func() {
		watchControlKeyFile(ctx, path, 10*time.Millisecond, keys, slog.New(slog.DiscardHandler))
		close(done)
	}()
	t.Cleanup(func() { <-done })
	write("new-key\n\nk1\n")
	waitFor(t, "the rotation", func() bool { return keysString(keys) == "new-key|k1" })
	write("\n")
	write("  new-key  \n")
	waitFor(t, "the previous key removed", func() bool { return keysString(keys) == "new-key|" })
	if _, _, err := readControlKeyFile(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing file read")
	}
}
