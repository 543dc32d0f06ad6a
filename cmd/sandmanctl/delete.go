package main

import (
	"context"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// delete deletes a sandbox's pod (its slot is released) and its token
// file.
func (c *ctl) delete(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fail(exitUsage, "delete: give NAME")
	}
	if err := c.kube.CoreV1().Pods(c.namespace).Delete(ctx, args[0], metav1.DeleteOptions{}); err != nil {
		return err
	}
	_ = os.Remove(c.tokenFile(args[0]))
	return nil
}
