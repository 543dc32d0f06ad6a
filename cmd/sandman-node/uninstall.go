package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// uninstallWatch tells an uninstall (the agent's DaemonSet or its namespace
// is gone or being deleted) from a rolling update or a restart, where bound
// sandboxes must outlive the agent. It watches both objects from the start:
// `kubectl delete -k` also deletes the agent's ServiceAccount and RBAC, so
// asking only once SIGTERM comes may no longer be allowed, while a watch
// opened before goes on.
type uninstallWatch struct {
	why atomic.Pointer[string]
}

func watchUninstall(ctx context.Context, ref string, log *slog.Logger) (*uninstallWatch, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("--uninstall-when-gone %q: want NAMESPACE/DAEMONSET", ref)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("--uninstall-when-gone: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	w := &uninstallWatch{}
	mark := func(why string) {
		if w.why.CompareAndSwap(nil, &why) {
			log.Info("uninstall seen: every sandbox goes when this agent stops", "why", why)
		}
	}
	byName := informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	})
	nsByName := informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ns).String()
	})
	follow := func(inf cache.SharedIndexInformer, what string) error {
		check := func(obj any) {
			if m, err := meta.Accessor(obj); err == nil && m.GetDeletionTimestamp() != nil {
				mark(what + " is being deleted")
			}
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    check,
			UpdateFunc: func(_, cur any) { check(cur) },
			DeleteFunc: func(any) { mark(what + " is gone") },
		})
		return err
	}
	nsf := informers.NewSharedInformerFactoryWithOptions(client, 0, nsByName)
	dsf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns), byName)
	if err := follow(nsf.Core().V1().Namespaces().Informer(), "namespace "+ns); err != nil {
		return nil, err
	}
	if err := follow(dsf.Apps().V1().DaemonSets().Informer(), "DaemonSet "+ref); err != nil {
		return nil, err
	}
	nsf.Start(ctx.Done())
	dsf.Start(ctx.Done())
	return w, nil
}

// Uninstalling says whether (and why) an uninstall has been seen.
func (w *uninstallWatch) Uninstalling() (bool, string) {
	if why := w.why.Load(); why != nil {
		return true, *why
	}
	return false, ""
}

// removeImages deletes the images the agent pulled into its containerd
// namespace, and the namespace once it is empty.
func removeImages(ctx context.Context, client *ctrd.Client, ns string) error {
	ctx = namespaces.WithNamespace(ctx, ns)
	imgs, err := client.ImageService().List(ctx)
	if err != nil {
		return fmt.Errorf("list images in %s: %w", ns, err)
	}
	var errs []error
	leases, err := client.LeasesService().List(ctx)
	if err == nil {
		for _, l := range leases {
			errs = append(errs, client.LeasesService().Delete(ctx, l))
		}
	}
	for i, img := range imgs {
		var opts []images.DeleteOpt
		if i == len(imgs)-1 {
			opts = append(opts, images.SynchronousDelete()) // collect content and snapshots now
		}
		if err := client.ImageService().Delete(ctx, img.Name, opts...); err != nil {
			errs = append(errs, fmt.Errorf("delete image %s: %w", img.Name, err))
		}
	}
	if err := client.NamespaceService().Delete(ctx, ns); err != nil {
		errs = append(errs, fmt.Errorf("delete containerd namespace %s: %w", ns, err))
	}
	return errors.Join(errs...)
}
