package noderuntime

import (
	"context"
	"fmt"

	ctrd "github.com/containerd/containerd/v2/client"

	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
)

// ensureImage returns ref unpacked into the slot snapshotter through the
// node's image manager: one pull per image however many binds wait.
// Failures a pod can fix (missing image, refused credentials, registry
// unreachable) are marked runtime.ErrImagePull; a full disk or containerd
// not answering is not, so the pool tries another node or again later.
// A private image is handed out only when the registry accepts secrets
// for it (nodeimage.Manager.Ensure).
func (r *Runtime) ensureImage(ctx context.Context, ref string, secrets [][]byte) (ctrd.Image, error) {
	img, err := r.images.Ensure(ctx, ref, secrets)
	if err != nil {
		return nil, markImagePull(err)
	}
	return img, nil
}

// authorizeImages checks, before a slot is taken, that no image is another
// namespace's snapshot (Config.SnapshotRepositories) and that the registry
// accepts the pod's pull secrets for each private image already on the
// node (public images and images not here cost nothing): a pod without
// them fails as an unauthorized pull would, and no slot, hot sandbox or
// image is touched. A hot sandbox runs before its pod is known, so this is
// what keeps a private image's hot sandboxes from pods that may not pull it.
func (r *Runtime) authorizeImages(ctx context.Context, req runtime.BindRequest) error {
	for _, c := range req.Containers {
		if err := r.images.AuthorizePod(ctx, c.Image, req.Pod.Namespace, req.PullSecrets); err != nil {
			return fmt.Errorf("bind %s: %w", req.Pod.UID, markImagePull(err))
		}
	}
	return nil
}

// markImagePull marks failures a pod can fix (missing image, refused
// credentials, registry unreachable) runtime.ErrImagePull; a full disk or
// containerd not answering is not, so the pool tries another node or again
// later.
func markImagePull(err error) error {
	if k := nodeimage.KindOf(err); k == nodeimage.KindDiskFull || k == nodeimage.KindRuntimeUnavailable || k == "" {
		return err
	}
	return imagePullError{err}
}

type imagePullError struct{ err error }

func (e imagePullError) Error() string   { return e.err.Error() }
func (e imagePullError) Unwrap() []error { return []error{runtime.ErrImagePull, e.err} }

// Images returns the node's image manager.
func (r *Runtime) Images() *nodeimage.Manager { return r.images }

// PrePull implements runtime.ImageCache.
func (r *Runtime) PrePull(ctx context.Context, images []string) error {
	if err := r.images.Pin(images...); err != nil {
		return fmt.Errorf("pre-pull: %w", err)
	}
	return nil
}

// Unpin implements runtime.ImageCache.
func (r *Runtime) Unpin(ctx context.Context, images []string) error {
	return r.images.Unpin(images...)
}

// ImageStatuses implements runtime.ImageCache.
func (r *Runtime) ImageStatuses(ctx context.Context) ([]runtime.ImageStatus, error) {
	return r.images.Statuses(ctx), nil
}

// imagesInUse are the images of hot, binding and bound slots (the image
// manager adds every container's).
func (r *Runtime) imagesInUse() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.slots {
		if s.Image != "" {
			out = append(out, s.Image)
		}
	}
	return out
}

// imageProgress publishes a pull's progress as a node event.
func (r *Runtime) imageProgress(p nodeimage.Progress) {
	ev := runtime.Event{Type: runtime.EventImageProgress, Time: r.cfg.Clock.Now(), Image: p.Image,
		BytesDone: p.BytesDone, BytesTotal: p.BytesTotal}
	switch {
	case p.Err != nil && nodeimage.KindOf(p.Err) == nodeimage.KindNotFound:
		ev.Reason, ev.Message = runtime.ReasonImageNotFound, p.Err.Error()
	case p.Err != nil:
		ev.Reason, ev.Message = runtime.ReasonErrImagePull, p.Err.Error()
	case p.Done:
		ev.Reason = "Pulled"
	}
	r.hub.Publish(ev)
}

// imagesChanged publishes the node's ready images.
func (r *Runtime) imagesChanged() {
	r.hub.Publish(runtime.Event{Type: runtime.EventImages, Time: r.cfg.Clock.Now(), Images: r.images.Ready()})
}
