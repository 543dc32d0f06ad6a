package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
)

// poolSecretKey is the key of the pool token in the pool Secret.
const poolSecretKey = "token"

// parseSecretName splits "namespace/name".
func parseSecretName(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want namespace/name", s)
	}
	return namespace, name, nil
}

// ensurePoolSecret returns the pool token kept in the Secret namespace/name,
// creating the Secret with a fresh random token (32 bytes, hex) when there is
// none. When another replica creates it first, its token is read and used.
// Needs get and create on secrets in that namespace.
func ensurePoolSecret(ctx context.Context, client kubernetes.Interface, namespace, name string) (string, error) {
	s, err := ensureSecret(ctx, client, namespace, name, corev1.SecretTypeOpaque, func() (map[string][]byte, error) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		return map[string][]byte{poolSecretKey: []byte(hex.EncodeToString(b))}, nil
	})
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(s.Data[poolSecretKey]))
	if token == "" {
		return "", fmt.Errorf("pool secret %s/%s has no non-empty %q key: put the pool token there "+
			"(kubectl -n %s create secret generic %s --from-literal=%s=$(openssl rand -hex 32)), or delete the Secret and sandman-vk makes one",
			namespace, name, poolSecretKey, namespace, name, poolSecretKey)
	}
	return token, nil
}

// ensureSecret returns the Secret namespace/name, creating it with the data
// fresh makes when there is none. When another replica creates it first,
// its Secret is read and used. Needs get and create on secrets there.
func ensureSecret(ctx context.Context, client kubernetes.Interface, namespace, name string, typ corev1.SecretType, fresh func() (map[string][]byte, error)) (*corev1.Secret, error) {
	secrets := client.CoreV1().Secrets(namespace)
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		data, ferr := fresh()
		if ferr != nil {
			return nil, ferr
		}
		s, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
				Labels: map[string]string{"app.kubernetes.io/part-of": "sandman"}},
			Type: typ,
			Data: data,
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Another replica made it between our get and create.
			s, err = secrets.Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w (sandman-vk needs get and create on secrets in namespace %s)", namespace, name, err, namespace)
	}
	return s, nil
}

// Keys of the node API CA Secret besides tls.crt and tls.key (the CA that
// signs): the previous CA, still trusted during a rotation.
const (
	previousCACertKey = "previous.crt"
	previousCAKeyKey  = "previous.key"
)

// parseNodeAPICA reads the current and (when present) previous CA.
func parseNodeAPICA(s *corev1.Secret) (cur, prev *nodetls.CA, err error) {
	if cur, err = nodetls.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return nil, nil, fmt.Errorf("secret %s/%s: %w (delete it and sandman-vk makes a new CA; the agents then ask for new certificates)", s.Namespace, s.Name, err)
	}
	pc, pk := s.Data[previousCACertKey], s.Data[previousCAKeyKey]
	if len(pc) == 0 && len(pk) == 0 {
		return cur, nil, nil
	}
	if prev, err = nodetls.ParseCA(pc, pk); err != nil {
		return nil, nil, fmt.Errorf("secret %s/%s, %s and %s (the previous CA during a rotation): %w", s.Namespace, s.Name, previousCACertKey, previousCAKeyKey, err)
	}
	if string(prev.Cert.RawSubject) == string(cur.Cert.RawSubject) {
		return nil, nil, fmt.Errorf("secret %s/%s: the previous and the current CA have the same subject %q: give the new CA another name (agents name the CA they trust by it)", s.Namespace, s.Name, cur.Cert.Subject)
	}
	return cur, prev, nil
}

// watchNodeAPICA returns the pool's node API CAs from the TLS Secret
// namespace/name (made with a new CA when missing) and follows the Secret
// until runCtx ends: a rotation takes effect at once, on every replica.
func watchNodeAPICA(ctx, runCtx context.Context, client kubernetes.Interface, namespace, name, pool string, log *slog.Logger) (*nodetls.Authority, error) {
	s, err := ensureSecret(ctx, client, namespace, name, corev1.SecretTypeTLS, func() (map[string][]byte, error) {
		ca, err := nodetls.NewCA(pool)
		if err != nil {
			return nil, err
		}
		return map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM}, nil
	})
	if err != nil {
		return nil, err
	}
	cur, prev, err := parseNodeAPICA(s)
	if err != nil {
		return nil, err
	}
	auth, err := nodetls.NewAuthority(cur, prev)
	if err != nil {
		return nil, err
	}
	seen := s.ResourceVersion
	err = followSecret(runCtx, client, namespace, name, func(s *corev1.Secret) {
		if s.ResourceVersion == seen {
			return
		}
		seen = s.ResourceVersion
		cur, prev, err := parseNodeAPICA(s)
		if err != nil {
			log.Error("node API CA not changed", "err", err)
			return
		}
		_ = auth.Set(cur, prev)
		prevName := ""
		if prev != nil {
			prevName = prev.Cert.Subject.CommonName
		}
		log.Info("node API CA changed", "current", cur.Cert.Subject.CommonName, "previous", prevName)
	}, func() {
		log.Warn("node API CA secret deleted: keeping the CAs held; a restart without it makes a new CA, and every agent then needs a new certificate",
			"secret", namespace+"/"+name)
	})
	if err != nil {
		return nil, err
	}
	return auth, nil
}

// followSecret calls onChange with the Secret namespace/name as it is and
// whenever it changes, and onDelete when it goes, until ctx ends (one
// informer narrowed to that name, so RBAC can be too). It returns once the
// informer has synced.
func followSecret(ctx context.Context, client kubernetes.Interface, namespace, name string, onChange func(*corev1.Secret), onDelete func()) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	set := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok && s.Name == name {
			onChange(s)
		}
	}
	if _, err := f.Core().V1().Secrets().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, cur any) { set(cur) },
		DeleteFunc: func(any) { onDelete() },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("secret %s/%s: informer for %v did not sync: %w", namespace, name, typ, context.Cause(ctx))
		}
	}
	return nil
}

// poolCredentials are how sandman-vk authenticates to the node agents:
// the node API CA with --node-api-ca-secret (mutual TLS; followed until
// ctx ends), and the pool token from --pool-secret-name, --token-file or
// SANDMAN_POOL_TOKEN (empty with the CA and none of those).
func poolCredentials(ctx context.Context, o options, client kubernetes.Interface, log *slog.Logger) (apiCerts *nodetls.Authority, token string, err error) {
	if o.nodeAPICASecret != "" {
		ns, name, err := parseSecretName(o.nodeAPICASecret)
		if err != nil {
			return nil, "", fmt.Errorf("--node-api-ca-secret: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		apiCerts, err = watchNodeAPICA(sctx, ctx, client, ns, name, o.poolName, log)
		cancel()
		if err != nil {
			return nil, "", err
		}
	}
	if o.poolSecretName != "" {
		ns, name, err := parseSecretName(o.poolSecretName)
		if err != nil {
			return nil, "", fmt.Errorf("--pool-secret-name: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		token, err = ensurePoolSecret(sctx, client, ns, name)
		cancel()
		if err != nil {
			return nil, "", err
		}
	} else if apiCerts == nil {
		if token, err = secret(o.tokenFile, "SANDMAN_POOL_TOKEN"); err != nil || token == "" {
			return nil, "", fmt.Errorf("no pool token: give --token-file, SANDMAN_POOL_TOKEN or --pool-secret-name (%v)", err)
		}
	}
	return apiCerts, token, nil
}

// secret reads a file's trimmed content, or an environment variable when
// no file is given.
func secret(file, env string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
