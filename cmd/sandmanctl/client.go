package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/podcontract"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// How sandmanctl reaches the cluster, the virtual node's routes and a
// sandbox's daemon, shared by the verbs.

// ctl is one invocation: the cluster it talks to, the namespace, where
// tokens are kept, and where it writes.
type ctl struct {
	kube      kubernetes.Interface
	namespace string
	tokenDir  string
	token     string
	out, errw io.Writer
}

// connect builds the clientset from the kubeconfig, as kubectl finds it,
// and picks the namespace: the flag's, else the context's.
func (c *ctl) connect(kubeconfig, namespace string) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return fail(exitError, "kubeconfig: %v", err)
	}
	c.namespace = namespace
	if c.namespace == "" {
		if c.namespace, _, err = cc.Namespace(); err != nil {
			return err
		}
	}
	// kubectl's rates: run --count creates many pods at once.
	rc.QPS, rc.Burst = 50, 300
	c.kube, err = kubernetes.NewForConfig(rc)
	return err
}

// tokenFile is where the token of sandbox name is kept.
func (c *ctl) tokenFile(name string) string { return filepath.Join(c.tokenDir, c.namespace, name) }

// daemon returns a client for a sandbox's daemon with its token.
func (c *ctl) daemon(ctx context.Context, name string) (*client.Client, error) {
	pod, err := c.kube.CoreV1().Pods(c.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fail(exitNotFound, "no sandbox %s in namespace %s", name, c.namespace)
		}
		return nil, err
	}
	if pod.Status.PodIP == "" || !ready(pod) {
		return nil, fail(exitError, "sandbox %s is not ready (%s)%s", name, pod.Status.Phase, waitingReason(pod))
	}
	token := c.token
	if token == "" {
		b, err := os.ReadFile(c.tokenFile(name))
		if err != nil {
			return nil, fail(exitUnauthorized, "no token for %s: %v (give --token or $SANDMAN_TOKEN)", name, err)
		}
		token = strings.TrimSpace(string(b))
	}
	return client.New(daemonAddr(pod), client.WithToken(token))
}

// splitRemote splits NAME:/path; ok is false for a local path.
func splitRemote(s string) (name, path string, ok bool) {
	name, path, ok = strings.Cut(s, ":")
	if !ok || name == "" || !strings.HasPrefix(path, "/") || strings.Contains(name, "/") {
		return "", s, false
	}
	return name, path, true
}

// ready says whether the pod's Ready condition is true.
func ready(pod *corev1.Pod) bool {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitingReason says why a pod is not Ready yet (": reason: message"),
// or nothing.
func waitingReason(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			return fmt.Sprintf(": %s: %s", w.Reason, w.Message)
		}
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Status == corev1.ConditionFalse && cond.Message != "" {
			return fmt.Sprintf(": %s: %s", cond.Reason, cond.Message)
		}
	}
	return ""
}

// virtualNode finds the virtual node of pool (or the only one).
func (c *ctl) virtualNode(ctx context.Context, pool string) (string, error) {
	sel := "type=virtual-kubelet," + podcontract.LabelPool
	if pool != "" {
		sel = "type=virtual-kubelet," + podcontract.LabelPool + "=" + pool
	}
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return "", err
	}
	switch len(nodes.Items) {
	case 0:
		return "", fail(exitNotFound, "no sandman virtual node (label %s)", sel)
	case 1:
		return nodes.Items[0].Name, nil
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Labels[podcontract.LabelPool])
	}
	return "", fail(exitUsage, "several pools (%s): choose one with --pool", strings.Join(names, ", "))
}

// nodeProxy is the apiserver's path to the virtual node's sandman routes.
func nodeProxy(node, route string) string {
	return "/api/v1/nodes/" + node + "/proxy" + vkapi.APIPrefix + route
}

// daemonAddr is the address of a sandbox pod's daemon.
func daemonAddr(pod *corev1.Pod) string {
	return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(api.Port))
}
