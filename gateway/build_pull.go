package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// A template's private base image (E2B's fromImageRegistry): the build's
// sandbox pulls it with the caller's credentials, which the gateway hands
// the pool as a kubernetes.io/dockerconfigjson Secret of the key's
// namespace named in the build pod's imagePullSecrets, as any pod's are.
// The Secret lives as long as the build's sandbox takes to start; it is
// deleted then, whatever happened. The node keeps the image private: a
// pod without credentials the registry accepts cannot start from it.

// registryAuth is a registry user and password.
type registryAuth struct{ user, password string }

// registryCredentials reads fromImageRegistry: "registry" (username and
// password) and "gcp" (a service account's JSON key, which Google's
// registries take as the password of user _json_key). "aws" needs a token
// from AWS's API, which the gateway does not call.
func registryCredentials(m map[string]any) (*registryAuth, error) {
	str := func(k string) string { s, _ := m[k].(string); return s }
	switch t := str("type"); t {
	case "registry":
		if str("username") == "" || str("password") == "" {
			return nil, errorf(errdefs.ErrInvalidArgument, "fromImageRegistry: type registry needs username and password")
		}
		return &registryAuth{str("username"), str("password")}, nil
	case "gcp":
		key := str("serviceAccountJson")
		if !json.Valid([]byte(key)) {
			return nil, errorf(errdefs.ErrInvalidArgument, "fromImageRegistry: type gcp needs serviceAccountJson, a service account's JSON key")
		}
		return &registryAuth{"_json_key", key}, nil
	case "aws":
		return nil, errorf(errdefs.ErrNotImplemented, "fromImageRegistry: type aws (fromAWSRegistry) is not supported by sandman's E2B gateway: ECR's password is a token from AWS's API, which the gateway does not call; use fromImage(image, {username: 'AWS', password: <aws ecr get-login-password>})")
	default:
		return nil, errorf(errdefs.ErrInvalidArgument, "fromImageRegistry: type %q is none of registry, gcp, aws", t)
	}
}

// pullSecretName is the name of build buildID's pull Secret.
func pullSecretName(buildID string) string { return "sandman-e2b-pull-" + buildID }

// createPullSecret makes the Secret that lets the build's sandbox pull
// image with auth, and returns its name.
func (g *Gateway) createPullSecret(ctx context.Context, p *buildPlan, image string, auth *registryAuth) (string, error) {
	named, err := reference.ParseDockerRef(image)
	if err != nil {
		return "", errorf(errdefs.ErrInvalidArgument, "fromImage %q: %v", image, err)
	}
	cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{
		reference.Domain(named): map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(auth.user + ":" + auth.password))},
	}})
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: pullSecretName(p.buildID), Namespace: p.key.Namespace,
			Labels: map[string]string{podcontract.LabelE2BBuild: p.buildID}},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg},
	}
	_, err = g.cfg.Client.CoreV1().Secrets(p.key.Namespace).Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsForbidden(err) {
		return "", fmt.Errorf("the gateway may not create the pull Secret of a build from a private image in namespace %s (give its role there secrets create and delete, as deploy/base/gateway.yaml's sandman-gateway-tenant does): %v", p.key.Namespace, apiMessage(err))
	}
	if err != nil {
		return "", kubeError("create the build's pull secret", err)
	}
	return sec.Name, nil
}

// deletePullSecret deletes a build's pull Secret.
func (g *Gateway) deletePullSecret(ctx context.Context, namespace, name string) {
	err := g.cfg.Client.CoreV1().Secrets(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		g.log.Warn("delete a build's pull secret", "secret", namespace+"/"+name, "err", err)
	}
}
