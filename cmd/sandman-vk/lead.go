package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/vk"
)

// leader is what only the leader runs (or the only process, without
// --leader-elect): the pool's placement and binds, the provider's
// reconciler, the pod and node controllers and the kubelet port, the
// node's owner. Every replica stands by warm beforehand.
type leader struct {
	o       options
	client  kubernetes.Interface
	pool    *pool.Pool
	node    *vk.Node
	clients *agentClients
	// epoch is sent with every node API call once this process leads (0:
	// no leader election, no epoch).
	epoch *atomic.Uint64
	// The kubelet port, bound at start; not served when tlsConfig is nil.
	kubeletL       net.Listener
	kubeletTLS     *tls.Config
	kubeletHandler http.Handler
	log            *slog.Logger
}

// takeoverSettle bounds how long a new leader waits for the binds its
// predecessor left running (cancelled when it stopped or died, so they
// end within moments; a cold pull inside one may take longer).
const takeoverSettle = 30 * time.Second

// lead runs what only the leader runs until ctx ends (a signal, a lost
// Lease) or one part fails: then the others stop too, and lead returns
// the first error once they have.
func (l *leader) lead(ctx context.Context, epoch uint64) error {
	l.epoch.Store(epoch)
	provider := l.node.Provider()
	if epoch > 0 {
		// From here on the agents refuse the previous leader.
		if err := l.clients.claim(ctx, l.log); err != nil {
			return fmt.Errorf("a newer leader has claimed the node agents: %w", err)
		}
		// The binds the previous leader left running end (bound: adopted
		// below; or not: placed anew), so none is bound twice.
		sctx, cancel := context.WithTimeout(ctx, takeoverSettle)
		if err := l.pool.WaitBindsSettled(sctx, 100*time.Millisecond); err != nil {
			l.log.Warn("the previous leader's binds have not all ended; adopting what is bound or binding now", "err", err)
		}
		cancel()
	}
	if err := provider.Adopt(ctx); err != nil {
		return fmt.Errorf("adopt running sandboxes: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := l.pool.Run(ctx); err != nil {
			return fmt.Errorf("pool: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := provider.Run(ctx); err != nil {
			return fmt.Errorf("provider: %w", err)
		}
		return nil
	})
	if l.o.ownerNamespace != "" {
		g.Go(func() error {
			ownNode(ctx, l.client, l.o.nodeName, l.o.ownerNamespace, l.log)
			return nil
		})
	}
	l.log.Info("virtual node starting", "vnode", l.o.nodeName, "pool", l.o.poolName, "agents", l.pool.NodeNames(), "ip", l.o.nodeIP, "epoch", epoch)
	if l.kubeletL != nil && l.kubeletTLS != nil {
		// As nodeutil would serve it, on the listener bound at start.
		srv := &http.Server{Handler: l.kubeletHandler, TLSConfig: l.kubeletTLS, ReadHeaderTimeout: 30 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(tls.NewListener(l.kubeletL, l.kubeletTLS)); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("kubelet API on %s: %w", l.kubeletL.Addr(), err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			_ = srv.Close()
			return nil
		})
	}
	g.Go(func() error {
		err := l.node.Run(ctx)
		if errors.Is(err, context.Canceled) {
			return nil // stopped: by a signal, a lost Lease, or another part's failure
		}
		if err != nil {
			return fmt.Errorf("virtual node: %w", err)
		}
		return nil
	})
	return g.Wait()
}

// run leads at once without --leader-elect; with it, it stands by until
// this process holds the Lease sandman-vk-<node-name>, and leads while it
// does.
func (l *leader) run(ctx context.Context) error {
	if !l.o.leaderElect {
		return l.lead(ctx, 0)
	}
	if l.o.nodeIP == "" {
		l.log.Warn("--leader-elect without --node-ip or POD_IP: the node's address does not follow the leader, so kubectl exec and logs reach no replica")
	}
	ns, err := leaseNamespace(l.o.leaderElectNamespace, os.Getenv("POD_NAMESPACE"))
	if err != nil {
		return err
	}
	return election{
		Client: l.client, Namespace: ns, Name: "sandman-vk-" + l.o.nodeName, Identity: leaseIdentity(os.Getenv("POD_NAME")),
		LeaseDuration: l.o.leaseDuration, RenewDeadline: l.o.renewDeadline, RetryPeriod: l.o.retryPeriod, Logger: l.log,
	}.run(ctx, l.lead)
}
