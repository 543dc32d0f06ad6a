package gateway

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A sandbox of a template built from code starts as the template left it:
// its environment, working directory and user are the pod's (container env,
// workingDir, securityContext runAsUser/runAsGroup: the daemon's own user,
// which commands naming no user run as), and its start command, if any,
// runs at each sandbox start: the gateway starts it through the daemon,
// as the template's user, once the pod is ready, and polls the ready
// command until it succeeds before the create answers. (E2B keeps the
// start command running in the template's memory snapshot; sandman's
// snapshots keep files only, so it runs again in every sandbox.)

// readyPollEvery is how often a template's ready command is tried.
const readyPollEvery = 200 * time.Millisecond

// applyBuilt puts a built template's environment, working directory and
// user into a sandbox's container; env (the create's) wins over the
// template's.
func applyBuilt(c *corev1.Container, b *builtTemplate, env map[string]string) {
	merged := maps.Clone(b.State.Env)
	if merged == nil {
		merged = map[string]string{}
	}
	if b.State.Home != "" {
		if _, ok := merged["HOME"]; !ok {
			merged["HOME"] = b.State.Home
		}
	}
	maps.Copy(merged, env)
	c.Env = nil
	for _, k := range sortedKeys(merged) {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: merged[k]})
	}
	c.WorkingDir = b.State.Workdir
	if b.State.UID != nil {
		if c.SecurityContext == nil {
			c.SecurityContext = &corev1.SecurityContext{}
		}
		c.SecurityContext.RunAsUser, c.SecurityContext.RunAsGroup = b.State.UID, b.State.GID
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// startTemplate runs a built template's start command in a new sandbox and
// waits for its ready command; nothing for other templates.
func (g *Gateway) startTemplate(ctx context.Context, pod *corev1.Pod, token string, t Template, env map[string]string) error {
	b := t.Built
	if b == nil || b.StartCmd == "" {
		return nil
	}
	x := g.sandboxExec(pod.Status.PodIP, token)
	c := command{Shell: b.StartCmd, User: b.State.User, Cwd: b.State.Workdir, Env: maps.Clone(b.State.Env)}
	if c.Env == nil {
		c.Env = map[string]string{}
	}
	maps.Copy(c.Env, env)
	if _, err := x.start(ctx, c); err != nil {
		return withCode(codeCreateFailed, fmt.Errorf("sandbox %s: template %s's start command: %w", pod.Name, t.Name, err))
	}
	if b.ReadyCmd == "" {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, g.cfg.CreateTimeout)
	defer cancel()
	ready := c
	ready.Shell = b.ReadyCmd
	var last string
	for {
		out, code, err := x.output(rctx, ready)
		if err == nil && code == 0 {
			return nil
		}
		last = strings.TrimSpace(out)
		if err != nil {
			last = err.Error()
		}
		select {
		case <-rctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return withCode(codeCreateFailed, fmt.Errorf("sandbox %s: template %s's ready command `%s` did not succeed within %s (last: %s)",
				pod.Name, t.Name, b.ReadyCmd, g.cfg.CreateTimeout, nonEmpty(last, fmt.Sprintf("exit code %d", code))))
		case <-time.After(readyPollEvery):
		}
	}
}
