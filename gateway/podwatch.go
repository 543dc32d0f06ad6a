package gateway

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sandman-dev/sandman/podcontract"
)

// podWatch is the gateway's watch of sandbox pods (label
// sandman.io/e2b-sandbox): one informer per namespace it watches, so its
// RBAC is a Role in each of them, never pods across the cluster. The set
// of namespaces can change while it runs (the keys Secret names a new
// one): a namespace added is watched from then on, one removed is
// forgotten.
type podWatch struct {
	client kubernetes.Interface
	// setup readies a new namespace's informer (transform, indexers,
	// handlers) before it runs.
	setup func(cache.SharedIndexInformer) error

	// mu guards ctx and byNS.
	mu sync.Mutex
	// ctx is run's; nil before run starts: informers added before then
	// start with it.
	ctx  context.Context
	byNS map[string]*nsWatch
	wg   sync.WaitGroup
}

// nsWatch is one namespace's informer.
type nsWatch struct {
	inf    cache.SharedIndexInformer
	cancel context.CancelFunc // nil until it runs
}

func newPodWatch(client kubernetes.Interface, setup func(cache.SharedIndexInformer) error) *podWatch {
	return &podWatch{client: client, setup: setup, byNS: map[string]*nsWatch{}}
}

// set makes namespaces the watched ones.
func (w *podWatch) set(namespaces []string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ns, nw := range w.byNS {
		if !slices.Contains(namespaces, ns) {
			if nw.cancel != nil {
				nw.cancel()
			}
			delete(w.byNS, ns)
		}
	}
	for _, ns := range namespaces {
		if w.byNS[ns] != nil {
			continue
		}
		f := informers.NewSharedInformerFactoryWithOptions(w.client, 0,
			informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = podcontract.LabelE2BSandbox }))
		nw := &nsWatch{inf: f.Core().V1().Pods().Informer()}
		if err := w.setup(nw.inf); err != nil {
			return err
		}
		w.byNS[ns] = nw
		if w.ctx != nil {
			w.start(nw)
		}
	}
	return nil
}

// start runs nw until run's context ends or its namespace is removed.
// Callers hold mu, with ctx set.
func (w *podWatch) start(nw *nsWatch) {
	ctx, cancel := context.WithCancel(w.ctx)
	nw.cancel = cancel
	w.wg.Go(func() { nw.inf.RunWithContext(ctx) })
}

// run runs the informers until ctx ends, and waits for them to stop.
func (w *podWatch) run(ctx context.Context) {
	w.mu.Lock()
	w.ctx = ctx
	for _, nw := range w.byNS {
		w.start(nw)
	}
	w.mu.Unlock()
	<-ctx.Done()
	w.wg.Wait()
}

// namespaces are the watched namespaces, sorted.
func (w *podWatch) namespaces() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.byNS))
	for ns := range w.byNS {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

func (w *podWatch) informer(namespace string) cache.SharedIndexInformer {
	w.mu.Lock()
	defer w.mu.Unlock()
	if nw := w.byNS[namespace]; nw != nil {
		return nw.inf
	}
	return nil
}

// watches says whether namespace is watched.
func (w *podWatch) watches(namespace string) bool { return w.informer(namespace) != nil }

// synced says whether namespace's pods have been listed.
func (w *podWatch) synced(namespace string) bool {
	inf := w.informer(namespace)
	return inf != nil && inf.HasSynced()
}

// get is the cached pod namespace/name.
func (w *podWatch) get(namespace, name string) (*corev1.Pod, bool) {
	inf := w.informer(namespace)
	if inf == nil {
		return nil, false
	}
	obj, ok, _ := inf.GetIndexer().GetByKey(namespace + "/" + name)
	pod, _ := obj.(*corev1.Pod)
	return pod, ok && pod != nil
}

// inNamespace are the cached pods of namespace.
func (w *podWatch) inNamespace(namespace string) []any {
	inf := w.informer(namespace)
	if inf == nil {
		return nil
	}
	return inf.GetStore().List()
}

// byID are the cached pods labelled sandbox id, in every watched
// namespace.
func (w *podWatch) byID(id string) []any {
	w.mu.Lock()
	infs := make([]cache.SharedIndexInformer, 0, len(w.byNS))
	for _, nw := range w.byNS {
		infs = append(infs, nw.inf)
	}
	w.mu.Unlock()
	var out []any
	for _, inf := range infs {
		objs, _ := inf.GetIndexer().ByIndex(indexSandboxID, id)
		out = append(out, objs...)
	}
	return out
}
