package vk

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// The apiserver serves a watch of pods by node name (the selector
// spec.nodeName=<node> a kubelet, and virtual-kubelet's pod controller,
// use) from its watch cache through a buffer of 10 events: a kubelet's
// ≤ 110 pods change rarely. It blocks its dispatch of every pod event, to
// every watcher, until the buffer has room or a short budget runs out, and
// then closes the watch. A virtual node with thousands of pods changing
// in a burst fills 10 events in tens of milliseconds: in the oversubscribed
// burst of docs/benchmarks.md the apiserver closed sandman-vk's watch
// ~3 times a second, its events (deletions, status changes) came late, and
// every other client's with them. A watch of all assigned pods
// (spec.nodeName!=) is not served by the node index and gets the buffer of
// any other watch, sized to about a second of the cluster's pod events
// (342 on the local stack, at most 1,000): 6 closes in that burst, not
// ~240. The pods of other nodes are dropped here, before they reach the
// informer's cache; their events still cost the apiserver and this
// process a decode each (protobuf, see ConfigureClient).

// widePodWatch wraps client so that listing and watching pods with the
// selector spec.nodeName=node (what virtual-kubelet's pod informer asks)
// asks the apiserver for all assigned pods instead and keeps node's.
// Every other call goes through unchanged.
func widePodWatch(client kubernetes.Interface, node string) kubernetes.Interface {
	return widePodsClientset{Interface: client, node: node,
		selector: fields.OneTermEqualSelector("spec.nodeName", node).String()}
}

type widePodsClientset struct {
	kubernetes.Interface
	node, selector string
}

func (c widePodsClientset) CoreV1() corev1client.CoreV1Interface {
	return widePodsCore{CoreV1Interface: c.Interface.CoreV1(), c: c}
}

type widePodsCore struct {
	corev1client.CoreV1Interface
	c widePodsClientset
}

func (c widePodsCore) Pods(namespace string) corev1client.PodInterface {
	return widePods{PodInterface: c.CoreV1Interface.Pods(namespace), c: c.c}
}

type widePods struct {
	corev1client.PodInterface
	c widePodsClientset
}

// assigned selects every pod bound to a node.
var assigned = fields.OneTermNotEqualSelector("spec.nodeName", "").String()

func (p widePods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	if opts.FieldSelector != p.c.selector {
		return p.PodInterface.List(ctx, opts)
	}
	opts.FieldSelector = assigned
	list, err := p.PodInterface.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	kept := list.Items[:0]
	for i := range list.Items {
		if list.Items[i].Spec.NodeName == p.c.node {
			kept = append(kept, list.Items[i])
		}
	}
	// The rest of the backing array holds other nodes' pods: let them go.
	clear(list.Items[len(kept):])
	list.Items = kept
	return list, nil
}

func (p widePods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if opts.FieldSelector != p.c.selector {
		return p.PodInterface.Watch(ctx, opts)
	}
	opts.FieldSelector = assigned
	w, err := p.PodInterface.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		if e.Type == watch.Bookmark {
			return e, true // it carries the resourceVersion
		}
		pod, ok := e.Object.(*corev1.Pod)
		return e, !ok || pod.Spec.NodeName == p.c.node // !ok: an error, with its reason
	}), nil
}
