package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandman-dev/sandman/runtime"
)

// watchCordon drains the node agent while its worker Node is cordoned
// (spec.unschedulable, as kubectl cordon and kubectl drain set it) and
// ends the drain when it is uncordoned: a drained worker holds no
// sandbox. kubeconfig empty: in-cluster credentials.
func watchCordon(ctx context.Context, kubeconfig, nodeName string, d runtime.Drainer, log *slog.Logger) error {
	client, err := kubeClient(kubeconfig)
	if err != nil {
		return fmt.Errorf("--drain-when-cordoned: %w", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	inf := f.Core().V1().Nodes().Informer()
	// The latest state wins; one drain at a time.
	var cordoned atomic.Bool
	kick := make(chan struct{}, 1)
	check := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			cordoned.Store(n.Spec.Unschedulable)
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    check,
		UpdateFunc: func(_, cur any) { check(cur) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	go func() {
		defer f.Shutdown()
		draining := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-kick:
				switch c := cordoned.Load(); {
				case c && !draining:
					draining = true
					why := "worker " + nodeName + " is cordoned"
					if err := d.Drain(ctx, why); err != nil {
						log.Error("drain", "why", why, "err", err)
					}
				case !c && draining:
					draining = false
					d.Undrain()
				}
			}
		}
	}()
	return nil
}

// kubeClient is a clientset from kubeconfig, or from in-cluster credentials
// when it is empty.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
