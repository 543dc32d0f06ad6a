package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// ownNode makes namespace ns (the install's) the owner of the virtual node
// object, once the node controller has made it: `kubectl delete -k` of the
// install deletes the namespace, and the garbage collector then deletes the
// node (and the pod garbage collector the pods left on it), as it deletes
// everything else the install made. It retries until ctx ends.
func ownNode(ctx context.Context, client kubernetes.Interface, node, ns string, log *slog.Logger) {
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			log.Warn("virtual node owner: read the namespace", "namespace", ns, "err", err)
			return false, nil
		}
		if err := ownNodeBy(ctx, client, node, n); err != nil {
			log.Debug("virtual node owner: not yet", "err", err)
			return false, nil
		}
		return true, nil
	})
	if err == nil {
		log.Info("virtual node owned by its install", "namespace", ns)
	}
}

// ownNodeBy sets the node's owner reference to namespace owner (a merge
// patch of metadata.ownerReferences; the node must exist).
func ownNodeBy(ctx context.Context, client kubernetes.Interface, node string, owner *corev1.Namespace) error {
	ref := metav1.OwnerReference{APIVersion: "v1", Kind: "Namespace", Name: owner.Name, UID: owner.UID, BlockOwnerDeletion: ptr.To(false)}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref}}})
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
