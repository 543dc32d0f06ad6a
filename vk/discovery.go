package vk

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Agent is a node agent's name and node API address.
type Agent struct {
	Name, Addr string
}

// ParseAgents parses a static list "name=host:port,name=host:port".
func ParseAgents(s string) ([]Agent, error) {
	var out []Agent
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("node agent %q: want name=host:port", item)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("node agent %q: %w", item, err)
		}
		out = append(out, Agent{Name: name, Addr: addr})
	}
	return out, nil
}

// DiscoverAgents follows the sandman-node DaemonSet's pods (the owner's
// namespace and a label selector) and keeps the pool's node agents in step:
// a running agent pod on worker W at address A is node agent W at A:port.
// A pod with the label that the DaemonSet does not control, or that runs as
// another ServiceAccount (AgentOwner.Check), is never used: it is logged
// with the reason. A running pod that
// is not Ready is followed too: its watch fails with the agent's own reason
// (say, containerd unreachable), so the worker shows unhealthy with that
// message instead of vanishing from the pool.
func DiscoverAgents(ctx context.Context, client kubernetes.Interface, owner AgentOwner, selector string, port int, log *slog.Logger, connect func(Agent)) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(owner.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().Pods().Informer()
	var sync func(obj any)
	sync = func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return
		}
		if !agentRunning(pod) {
			return
		}
		why, err := owner.Check(ctx, client, pod)
		if err != nil {
			// The apiserver did not answer: ask again in a while (an
			// agent already followed stays followed meanwhile).
			log.Warn("node agent pod not checked; retrying", "pod", pod.Name, "err", err)
			time.AfterFunc(2*time.Second, func() {
				if cur, ok, _ := inf.GetStore().Get(obj); ok && ctx.Err() == nil {
					sync(cur)
				}
			})
			return
		}
		if why != "" {
			log.Warn("ignoring a pod that is not a node agent of this pool", "pod", pod.Name, "node", pod.Spec.NodeName, "reason", why)
			return
		}
		connect(Agent{Name: pod.Spec.NodeName, Addr: net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port))})
	}
	// An agent pod that stops or goes (a rolling update, a crash, an
	// uninstall) does not take its worker out of the pool: the worker's
	// sandboxes keep running, the watch fails and the worker shows
	// unhealthy, and the next agent pod on the worker is followed in its
	// place. Only if none comes within the pool's LostAfter are the
	// worker's pods reported lost.
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: sync,
		UpdateFunc: func(old, cur any) {
			o, _ := old.(*corev1.Pod)
			c, _ := cur.(*corev1.Pod)
			if o == nil || c == nil || !agentRunning(o) || o.Status.PodIP != c.Status.PodIP {
				sync(cur)
			}
		},
	})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	return nil
}

func agentRunning(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != ""
}
