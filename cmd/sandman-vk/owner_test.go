package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// TestOwnNode: the node gets the install's namespace as its owner once it
// exists; until then ownNode keeps trying.
func TestOwnNode(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sandman-system", UID: "ns-uid"}}
	client := fake.NewClientset(ns)
	ctx := t.Context()
	done := make(chan struct{})
	go func() {
		ownNode(ctx, client, "sandman-p", "sandman-system", slog.New(slog.DiscardHandler))
		close(done)
	}()
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sandman-p"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, "sandman-p", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		refs := n.OwnerReferences
		return len(refs) == 1 && refs[0].Kind == "Namespace" && refs[0].Name == "sandman-system" && refs[0].UID == "ns-uid", nil
	})
	if err != nil {
		t.Fatalf("the node never got its owner: %v", err)
	}
	<-done
}
