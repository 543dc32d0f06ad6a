package nodeimage

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// DeleteManifest deletes a manifest, named by digest (repository@sha256:…),
// from its registry: the registry API's DELETE, through the hosts the
// node's registry settings give for its host (plain HTTP, CA files, a
// mirror's path), with credentials from secrets (docker config JSON). A
// manifest already gone is not an error; a registry that does not delete
// (deletion off) is ErrNotImplemented.
func (m *Manager) DeleteManifest(ctx context.Context, ref string, secrets [][]byte) error {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return fmt.Errorf("delete %s: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	canonical, ok := named.(reference.Canonical)
	if !ok {
		return fmt.Errorf("delete %s: name it by digest: %w", ref, errdefs.ErrInvalidArgument)
	}
	resolver := m.newHosts(ctx, parseDockerConfigs(secrets))
	hosts, err := resolver(reference.Domain(named))
	if err != nil {
		return fmt.Errorf("delete %s: %w", ref, err)
	}
	var last error
	for _, h := range hosts {
		if !h.Capabilities.Has(docker.HostCapabilityPush) {
			continue
		}
		u := fmt.Sprintf("%s://%s%s/%s/manifests/%s", h.Scheme, h.Host, h.Path, reference.Path(named), canonical.Digest())
		last = deleteOn(ctx, h, u)
		if last == nil {
			return nil
		}
	}
	if last == nil {
		last = fmt.Errorf("no registry host of %s takes writes", reference.Domain(named))
	}
	return fmt.Errorf("delete %s: %w", ref, last)
}

func deleteOn(ctx context.Context, h docker.RegistryHost, url string) error {
	for try := 0; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, url, nil)
		if err != nil {
			return err
		}
		for k, v := range h.Header {
			req.Header[k] = v
		}
		if h.Authorizer != nil {
			if err := h.Authorizer.Authorize(ctx, req); err != nil {
				return err
			}
		}
		client := h.Client
		if client == nil {
			client = http.DefaultClient
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusNotFound:
			return nil
		case resp.StatusCode == http.StatusUnauthorized && try == 0 && h.Authorizer != nil:
			if err := h.Authorizer.AddResponses(ctx, []*http.Response{resp}); err != nil {
				return err
			}
			continue
		case resp.StatusCode == http.StatusMethodNotAllowed:
			return fmt.Errorf("the registry does not delete manifests (%s): %w", resp.Status, errdefs.ErrNotImplemented)
		}
		return fmt.Errorf("registry answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
}
