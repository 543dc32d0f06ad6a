package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/podcontract"
)

// pause and resume set or remove a sandbox's podcontract.AnnotationPause
// and wait until its ConditionPaused says it is done (resume: and it is
// Ready again), or says why not.
func (c *ctl) pause(ctx context.Context, args []string, paused bool) error {
	verb := "resume"
	if paused {
		verb = "pause"
	}
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(c.errw)
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait")
	if err := fs.Parse(args); err != nil {
		return fail(exitUsage, "")
	}
	if fs.NArg() != 1 {
		return fail(exitUsage, "%s: give NAME", verb)
	}
	name := fs.Arg(0)
	var value any // null removes the annotation
	if paused {
		value = "true"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{podcontract.AnnotationPause: value}}})
	if err != nil {
		return err
	}
	pods := c.kube.CoreV1().Pods(c.namespace)
	start := time.Now()
	if _, err := pods.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var last *corev1.Pod
	for {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = pod
			if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
				return fail(exitError, "sandbox %s ended: %s %s", name, pod.Status.Reason, pod.Status.Message)
			}
			cond := pausedCondition(pod)
			switch {
			case cond == nil:
			case paused && cond.Reason == podcontract.ReasonPaused:
				fmt.Fprintf(c.out, "%s paused in %v: %s\n", name, time.Since(start).Round(time.Millisecond), cond.Message)
				return nil
			case paused && cond.Reason == podcontract.ReasonPauseFailed:
				return fail(exitError, "sandbox %s: %s", name, cond.Message)
			case !paused && cond.Reason == podcontract.ReasonResumed && ready(pod):
				fmt.Fprintf(c.out, "%s resumed in %v\n", name, time.Since(start).Round(time.Millisecond))
				return nil
			}
			if !paused && cond == nil && ready(pod) {
				fmt.Fprintf(c.out, "%s is running (it was not paused)\n", name)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			why := ""
			if c := pausedCondition(last); c != nil {
				why = ": " + c.Reason + " " + c.Message
			}
			return fail(exitError, "sandbox %s: %s not done after %v%s", name, verb, *timeout, why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pausedCondition is a pod's ConditionPaused, if it has one.
func pausedCondition(pod *corev1.Pod) *corev1.PodCondition {
	if pod == nil {
		return nil
	}
	for i, c := range pod.Status.Conditions {
		if c.Type == podcontract.ConditionPaused {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}
