package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/podcontract"
)

// get lists sandboxes (pods with a sandman.io/token-sha256 annotation or on
// a virtual node) with their idle time from the daemon's health.
func (c *ctl) get(ctx context.Context, args []string) error {
	pods, err := c.kube.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tNODE\tPHASE\tIP\tAGE\tIDLE")
	found := false
	for _, pod := range pods.Items {
		if len(args) > 0 && pod.Name != args[0] {
			continue
		}
		if pod.Spec.NodeSelector[podcontract.LabelPool] == "" && pod.Annotations[podcontract.AnnotationTokenSHA256] == "" {
			continue
		}
		found = true
		idle := "-"
		if ready(&pod) && pod.Status.PodIP != "" {
			if d, err := client.New(daemonAddr(&pod), client.WithRetries(0)); err == nil {
				hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				if h, err := d.Health(hctx); err == nil {
					idle = duration.HumanDuration(time.Duration(h.IdleSeconds * float64(time.Second)))
					if h.Running > 0 {
						idle = fmt.Sprintf("busy (%d running)", h.Running)
					}
				}
				cancel()
			}
		}
		phase := string(pod.Status.Phase)
		if pod.Status.Reason == podcontract.ReasonPaused && pod.Status.Phase == corev1.PodRunning {
			phase = podcontract.ReasonPaused // as kubectl's STATUS says it
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", pod.Name, orDash(pod.Spec.NodeName), phase, orDash(pod.Status.PodIP),
			duration.HumanDuration(time.Since(pod.CreationTimestamp.Time)), idle)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(args) > 0 && !found {
		return fail(exitNotFound, "no sandbox %s in namespace %s", args[0], c.namespace)
	}
	return nil
}
