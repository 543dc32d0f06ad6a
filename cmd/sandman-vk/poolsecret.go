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
	secrets := client.CoreV1().Secrets(namespace)
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		s, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
				Labels: map[string]string{"app.kubernetes.io/part-of": "sandman"}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{poolSecretKey: []byte(hex.EncodeToString(b))},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Another replica made it between our get and create.
			s, err = secrets.Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return "", fmt.Errorf("pool secret %s/%s: %w (sandman-vk needs get and create on secrets in namespace %s)", namespace, name, err, namespace)
	}
	token := strings.TrimSpace(string(s.Data[poolSecretKey]))
	if token == "" {
		return "", fmt.Errorf("pool secret %s/%s has no non-empty %q key: put the pool token there "+
			"(kubectl -n %s create secret generic %s --from-literal=%s=$(openssl rand -hex 32)), or delete the Secret and sandman-vk makes one",
			namespace, name, poolSecretKey, namespace, name, poolSecretKey)
	}
	return token, nil
}
