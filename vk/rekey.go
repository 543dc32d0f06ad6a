package vk

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// Re-keying: when the current control key changes (ControlKeys.Set), every
// running authenticated sandbox is moved to it. Each daemon of the sandbox
// is asked, with the token of a previous key, to replace that token by the
// current key's (POST /v1/token); the creator's token stays. A daemon that
// refuses every previous key but takes the current one is done already.
// Failures are tried again every ReconcileInterval. Only the leader runs
// it (Run). sandman_vk_sandboxes_on_previous_control_key counts what is
// left: at 0 the previous keys can go.

// rekeyWorkers bounds the sandboxes re-keyed at once.
const rekeyWorkers = 64

// runRekey re-keys sandboxes to the current control key at the start, on
// every change of the keys, and every ReconcileInterval while ctx lasts.
func (p *Provider) runRekey(ctx context.Context) {
	if p.cfg.ControlKeys == nil {
		return
	}
	t := p.cfg.NewTicker(p.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		changed := p.cfg.ControlKeys.Changed()
		p.rekey(ctx)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C():
		}
	}
}

// onPreviousKeyLocked says sb's daemons hold a token the control plane
// issued and are not known to take the current key's: running, or queued
// with a token of a key that was current when it was submitted.
func onPreviousKeyLocked(sb *sandbox, keys *keySet) bool {
	return len(sb.req.TokenHashes) > 0 && (sb.started() || sb.submitted) && !sb.terminal() && !sb.deleting &&
		!hmac.Equal(sb.controlKey, keys.current)
}

// rekey runs one round: every ready sandbox not known to hold the current
// key is re-keyed, rekeyWorkers at a time.
func (p *Provider) rekey(ctx context.Context) {
	keys := p.cfg.ControlKeys.set.Load()
	type due struct {
		uid, pod, ip string
		containers   []string
		from         []byte
	}
	var list []due
	p.mu.Lock()
	for uid, sb := range p.byUID {
		if !onPreviousKeyLocked(sb, keys) || !sb.started() || !sb.isReady || sb.slot.IP == "" {
			continue
		}
		if sb.controlKey == nil && len(keys.previous) == 0 {
			// Adopted, and the current key is the only one it can hold.
			sb.controlKey = keys.current
			continue
		}
		d := due{uid: uid, pod: podKey(sb.pod.Namespace, sb.pod.Name), ip: sb.slot.IP, from: sb.controlKey}
		for _, c := range sb.pod.Spec.Containers {
			d.containers = append(d.containers, c.Name)
		}
		list = append(list, d)
	}
	p.mu.Unlock()
	if len(list) == 0 {
		return
	}
	var g errgroup.Group
	g.SetLimit(rekeyWorkers)
	done := make(chan bool, len(list))
	for _, d := range list {
		g.Go(func() error {
			err := p.rekeySandbox(ctx, d.uid, d.ip, d.containers, d.from, keys)
			p.mu.Lock()
			sb := p.byUID[d.uid]
			quiet := sb != nil && sb.rekeyFailed
			if sb != nil {
				if err == nil {
					sb.controlKey, sb.rekeyFailed = keys.current, false
				} else {
					sb.rekeyFailed = true
				}
			}
			p.mu.Unlock()
			switch {
			case err == nil:
			case quiet || ctx.Err() != nil:
				p.log.Debug("re-key sandbox to the current control key", "pod", d.pod, "uid", d.uid, "err", err)
			default:
				p.log.Warn("re-key sandbox to the current control key (tried again every reconcile interval)", "pod", d.pod, "uid", d.uid, "err", err)
			}
			done <- err == nil
			return nil
		})
	}
	_ = g.Wait()
	close(done)
	ok := 0
	for d := range done {
		if d {
			ok++
		}
	}
	level := slog.LevelInfo
	if ok == 0 {
		level = slog.LevelDebug // the same failures, round after round
	}
	p.log.Log(ctx, level, "re-keyed sandboxes to the current control key", "rekeyed", ok, "failed", len(list)-ok, "previous_keys", len(keys.previous))
}

// rekeySandbox moves every daemon of one sandbox (container i serves on
// daemonapi.Port+i) to the current key's token.
func (p *Provider) rekeySandbox(ctx context.Context, uid, ip string, containers []string, from []byte, keys *keySet) error {
	newHash := tokenHash(ControlToken(keys.current, uid))
	for i, name := range containers {
		addr := ip + ":" + strconv.Itoa(daemonapi.Port+i)
		if err := p.rekeyDaemon(ctx, addr, uid, from, keys, newHash); err != nil {
			return fmt.Errorf("container %s (%s): %w", name, addr, err)
		}
	}
	return nil
}

// rekeyDaemon replaces the token of a previous key (from first, when it is
// one) by newHash; when the daemon refuses every previous key, it checks
// that it takes the current one (re-keyed already: by an earlier round cut
// short, or by the previous leader).
func (p *Provider) rekeyDaemon(ctx context.Context, addr, uid string, from []byte, keys *keySet, newHash string) error {
	var order [][]byte
	if from != nil && !hmac.Equal(from, keys.current) && keys.has(from) {
		order = append(order, from)
	}
	for _, k := range keys.previous {
		if from == nil || !hmac.Equal(k, from) {
			order = append(order, k)
		}
	}
	newClient := func(key []byte) (*client.Client, error) {
		return client.New(addr, client.WithHTTPClient(p.daemonHTTP), client.WithRetries(0), client.WithToken(ControlToken(key, uid)))
	}
	for _, k := range order {
		c, err := newClient(k)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = c.RotateToken(cctx, newHash)
		cancel()
		if !client.IsCode(err, daemonapi.CodeUnauthorized) {
			return err // nil: re-keyed
		}
	}
	c, err := newClient(keys.current)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h, err := c.Health(cctx)
	if err != nil {
		return err
	}
	if h.Version == "" {
		// Health answers only {"status"} to a token it does not take.
		return errors.New("the daemon takes neither the current control key's token nor a previous key's: " +
			"was control-key-previous removed before sandman_vk_sandboxes_on_previous_control_key reached 0?")
	}
	return nil
}
