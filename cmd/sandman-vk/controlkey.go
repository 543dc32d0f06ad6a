package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandman-dev/sandman/vk"
)

// The data keys of the control key Secret (--control-key-secret): the key
// new sandboxes' control tokens come from, and keys sandboxes may still
// hold tokens of (one a line), which sandman-vk re-keys them from.
const (
	controlKeyKey         = "control-key"
	controlKeyPreviousKey = "control-key-previous"
)

// splitKeys are the non-empty lines of b, trimmed.
func splitKeys(b []byte) [][]byte {
	var out [][]byte
	for line := range bytes.Lines(b) {
		if k := bytes.TrimSpace(line); len(k) > 0 {
			out = append(out, bytes.Clone(k))
		}
	}
	return out
}

// controlKeysOf reads the current and previous control keys of a control
// key Secret.
func controlKeysOf(s *corev1.Secret) (current []byte, previous [][]byte, err error) {
	current = bytes.TrimSpace(s.Data[controlKeyKey])
	if len(current) == 0 || bytes.ContainsAny(current, "\r\n") {
		return nil, nil, fmt.Errorf("secret %s/%s: key %q must hold one non-empty key "+
			"(kubectl -n %s patch secret %s --type merge -p '{\"stringData\":{\"%s\":\"'$(openssl rand -hex 32)'\"}}'), "+
			"or delete the Secret and sandman-vk makes one (sandboxes keyed by the lost key then answer kubectl exec no more)",
			s.Namespace, s.Name, controlKeyKey, s.Namespace, s.Name, controlKeyKey)
	}
	return bytes.Clone(current), splitKeys(s.Data[controlKeyPreviousKey]), nil
}

// ensureControlKeySecret returns the control keys kept in the Secret
// namespace/name, creating it with a fresh random key (32 bytes, hex) when
// there is none, and what seed returns (the key sandboxes held tokens of
// until then, e.g. the pool token; empty: none) as its previous key, so
// running sandboxes are re-keyed rather than cut off. Another replica's
// Secret wins a race.
func ensureControlKeySecret(ctx context.Context, client kubernetes.Interface, namespace, name string, seed func() ([]byte, error)) ([]byte, [][]byte, error) {
	s, err := ensureSecret(ctx, client, namespace, name, corev1.SecretTypeOpaque, func() (map[string][]byte, error) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		data := map[string][]byte{controlKeyKey: []byte(hex.EncodeToString(b))}
		prev, err := seed()
		if err != nil {
			return nil, err
		}
		if prev = bytes.TrimSpace(prev); len(prev) > 0 {
			data[controlKeyPreviousKey] = prev
		}
		return data, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return controlKeysOf(s)
}

// readSeedSecret is the "token" of the Secret namespace/name (an earlier
// install's pool secret), or nothing when there is no such Secret.
func readSeedSecret(ctx context.Context, client kubernetes.Interface, namespace, name string) ([]byte, error) {
	s, err := client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--control-key-seed-secret %s/%s: %w", namespace, name, err)
	}
	return s.Data[poolSecretKey], nil
}

// watchControlKeySecret follows the control key Secret (an informer on that
// one name: RBAC can name it) and sets keys from each version of it; an
// unreadable version, or the Secret's deletion, leaves the keys as they
// are. It returns once the informer has synced; the informer runs until
// ctx ends.
func watchControlKeySecret(ctx context.Context, client kubernetes.Interface, namespace, name string, keys *vk.ControlKeys, log *slog.Logger) error {
	return followSecret(ctx, client, namespace, name, func(s *corev1.Secret) {
		current, previous, err := controlKeysOf(s)
		if err == nil {
			err = keys.Set(current, previous...)
		}
		if err != nil {
			log.Error("control key secret: keeping the keys held until it is fixed", "err", err)
			return
		}
		log.Info("control keys", "secret", namespace+"/"+name, "previous", len(keys.Previous()), "resourceVersion", s.ResourceVersion)
	}, func() {
		log.Warn("control key secret deleted: keeping the keys held; a restart without it makes a new key, and sandboxes keyed by the old one answer kubectl exec no more",
			"secret", namespace+"/"+name)
	})
}

// readControlKeyFile reads a control key file: one key a line, the current
// first, then previous ones.
func readControlKeyFile(path string) ([]byte, [][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	keys := splitKeys(b)
	if len(keys) == 0 {
		return nil, nil, fmt.Errorf("%s: no key in it (one key a line: the current one first, then previous ones)", path)
	}
	return keys[0], keys[1:], nil
}

// watchControlKeyFile reads the control key file again whenever its
// modification time or size changes (checked every interval) and sets
// keys from it, until ctx ends; an unreadable version leaves the keys as
// they are (and is logged).
func watchControlKeyFile(ctx context.Context, path string, every time.Duration, keys *vk.ControlKeys, log *slog.Logger) {
	stamp := func() (time.Time, int64, error) {
		fi, err := os.Stat(path)
		if err != nil {
			return time.Time{}, 0, err
		}
		return fi.ModTime(), fi.Size(), nil
	}
	// The first check reads the file again: it may have changed since
	// the caller read it (a Set of the same keys changes nothing).
	var lastMod time.Time
	lastSize := int64(-1)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		mod, size, err := stamp()
		if err != nil || mod.Equal(lastMod) && size == lastSize {
			continue
		}
		lastMod, lastSize = mod, size
		current, previous, err := readControlKeyFile(path)
		if err == nil {
			err = keys.Set(current, previous...)
		}
		if err != nil {
			log.Error("control key file: keeping the keys held until it is fixed", "file", path, "err", err)
			continue
		}
		log.Info("control keys", "file", path, "previous", len(keys.Previous()))
	}
}

// errNoControlKey says sandman-vk was given nothing to derive control
// tokens from.
var errNoControlKey = errors.New("no control key: give --control-key-secret or --pool-secret-file (or a pool token, which is then the control key)")

// loadControlKeys reads the control keys from --control-key-secret
// (created when missing, seeded with the pool token or
// --control-key-seed-secret), from --pool-secret-file, or else takes the
// pool token; they are followed until ctx ends (wg waits for the file's
// watch). nil: there is no control key.
func loadControlKeys(ctx context.Context, wg *sync.WaitGroup, o options, client kubernetes.Interface, token string, log *slog.Logger) (*vk.ControlKeys, error) {
	switch {
	case o.controlKeySecret != "":
		ns, name, err := parseSecretName(o.controlKeySecret)
		if err != nil {
			return nil, fmt.Errorf("--control-key-secret: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		// Until now the pool token (if any) was the control key: a new
		// Secret keeps it as the previous key, so running sandboxes are
		// re-keyed, not cut off.
		seed := func() ([]byte, error) { return []byte(token), nil }
		if o.controlKeySeedSecret != "" {
			sns, sname, err := parseSecretName(o.controlKeySeedSecret)
			if err != nil {
				return nil, fmt.Errorf("--control-key-seed-secret: %w", err)
			}
			seed = func() ([]byte, error) { return readSeedSecret(sctx, client, sns, sname) }
		}
		current, previous, err := ensureControlKeySecret(sctx, client, ns, name, seed)
		if err != nil {
			return nil, err
		}
		keys, err := vk.NewControlKeys(current, previous...)
		if err != nil {
			return nil, err
		}
		if err := watchControlKeySecret(ctx, client, ns, name, keys, log); err != nil {
			return nil, err
		}
		return keys, nil
	case o.poolSecretFile != "":
		current, previous, err := readControlKeyFile(o.poolSecretFile)
		if err != nil {
			return nil, fmt.Errorf("--pool-secret-file: %w", err)
		}
		keys, err := vk.NewControlKeys(current, previous...)
		if err != nil {
			return nil, err
		}
		wg.Go(func() { watchControlKeyFile(ctx, o.poolSecretFile, 2*time.Second, keys, log) })
		return keys, nil
	case token != "":
		return vk.NewControlKeys([]byte(token))
	}
	log.Warn(errNoControlKey.Error() + ": kubectl exec and logs of authenticated sandboxes, and their idle timeouts, do not work")
	return nil, nil
}
