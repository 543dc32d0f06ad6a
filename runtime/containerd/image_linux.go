package containerd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// errImagePull marks pull failures other than a missing image.
var errImagePull = errors.New("image pull failed")

// ensureImage returns ref unpacked into the slot snapshotter, pulling it
// once however many binds wait for it (they share the result and the
// error). It is the simple pull the nodeimage package will replace.
func (r *Runtime) ensureImage(ctx context.Context, ref string, secrets [][]byte) (ctrd.Image, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return nil, fmt.Errorf("image %q is not a valid reference: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	name := named.String()
	if img, err := r.client.GetImage(ctx, name); err == nil {
		if ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter); err == nil && ok {
			return img, nil
		}
	}
	v, err, _ := r.pulls.Do(name, func() (any, error) {
		// One waiter giving up must not fail the others.
		pctx := context.WithoutCancel(ctx)
		img, err := r.client.Pull(pctx, name, ctrd.WithPullUnpack, ctrd.WithPullSnapshotter(r.cfg.Snapshotter),
			ctrd.WithResolver(r.resolver(secrets)))
		if err != nil {
			if errdefs.IsNotFound(err) {
				return nil, fmt.Errorf("image %s: not found in the registry (%v): %w", name, err, errdefs.ErrNotFound)
			}
			return nil, fmt.Errorf("pull %s: %v: %w", name, err, errImagePull)
		}
		return img, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(ctrd.Image), nil
}

// resolver talks to registries with the pod's pull secrets (docker config
// JSON) and plain HTTP where the configuration says so.
func (r *Runtime) resolver(secrets [][]byte) remotes.Resolver {
	plain := r.cfg.PlainHTTP
	if plain == nil {
		plain = docker.MatchLocalhost
	}
	creds := parseDockerConfigs(secrets)
	opts := []docker.RegistryOpt{docker.WithPlainHTTP(plain)}
	if len(creds) > 0 {
		opts = append(opts, docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthCreds(func(host string) (string, string, error) {
			c := creds[host]
			return c[0], c[1], nil
		}))))
	}
	return docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(opts...)})
}

// parseDockerConfigs reads {"auths":{"host":{"auth":"base64(user:pass)"}}}
// (or username/password) into host → [user, password].
func parseDockerConfigs(secrets [][]byte) map[string][2]string {
	out := map[string][2]string{}
	for _, s := range secrets {
		var cfg struct {
			Auths map[string]struct {
				Auth     string `json:"auth"`
				Username string `json:"username"`
				Password string `json:"password"`
			} `json:"auths"`
		}
		if json.Unmarshal(s, &cfg) != nil {
			continue
		}
		for host, a := range cfg.Auths {
			host = strings.TrimPrefix(strings.TrimPrefix(host, "https://"), "http://")
			host = strings.TrimSuffix(host, "/")
			user, pass := a.Username, a.Password
			if a.Auth != "" {
				if b, err := base64.StdEncoding.DecodeString(a.Auth); err == nil {
					user, pass, _ = strings.Cut(string(b), ":")
				}
			}
			if host == "docker.io" || host == "index.docker.io/v1" {
				host = "registry-1.docker.io"
			}
			out[host] = [2]string{user, pass}
		}
	}
	return out
}
