package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
)

// poolSecretKey is the key of the pool token in the pool Secret; the node
// agents mount the same Secret and read the same key.
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

// ensureNodeAPICA returns the pool's node API CA kept in the TLS Secret
// namespace/name, making a new CA when there is none.
func ensureNodeAPICA(ctx context.Context, client kubernetes.Interface, namespace, name, pool string) (*nodetls.CA, error) {
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
	ca, err := nodetls.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w (delete it and sandman-vk makes a new CA; the agents then ask for new certificates)", namespace, name, err)
	}
	return ca, nil
}
