package vk

import (
	"context"
	"io"

	dto "github.com/prometheus/client_model/go"
	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// The kubelet API of the virtual node (kubectl exec, logs, attach, stats)
// reaches sandboxes through their daemons; until that lands these calls say
// plainly that they are not served.

var _ nodeutil.Provider = (*Provider)(nil)

func (p *Provider) notServed(what string) error {
	return vkerrdefs.InvalidInputf("%s is not served by virtual node %s yet: call the sandbox's daemon API at the pod IP (port 49983)", what, p.cfg.NodeName)
}

// GetContainerLogs implements nodeutil.Provider.
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	return nil, p.notServed("kubectl logs")
}

// RunInContainer implements nodeutil.Provider.
func (p *Provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	return p.notServed("kubectl exec")
}

// AttachToContainer implements nodeutil.Provider.
func (p *Provider) AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error {
	return p.notServed("kubectl attach")
}

// PortForward implements nodeutil.Provider.
func (p *Provider) PortForward(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
	return p.notServed("kubectl port-forward")
}

// GetStatsSummary implements nodeutil.Provider: the node and its pods,
// without usage figures yet.
func (p *Provider) GetStatsSummary(ctx context.Context) (*statsv1alpha1.Summary, error) {
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.cfg.NodeName, StartTime: metav1.Now()}}
	pods, _ := p.GetPods(ctx)
	for _, pod := range pods {
		s.Pods = append(s.Pods, statsv1alpha1.PodStats{PodRef: statsv1alpha1.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)}, StartTime: pod.CreationTimestamp})
	}
	return s, nil
}

// GetMetricsResource implements nodeutil.Provider.
func (p *Provider) GetMetricsResource(ctx context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}
