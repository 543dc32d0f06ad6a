package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

// errLostLeadership ends a leader that could not renew its Lease: it exits
// non-zero, as kube-controller-manager does, and comes back as a standby.
var errLostLeadership = errors.New("lost the leader Lease: stopped placing; exiting so that a restart comes back as a standby")

// election runs the virtual node's leader election on a coordination
// Lease (client-go's leaderelection).
type election struct {
	Client    kubernetes.Interface
	Namespace string
	// Name is the Lease's name ("sandman-vk-" + the virtual node's).
	Name string
	// Identity is this process's, unique per process (pod name + suffix).
	Identity string
	// LeaseDuration is how long a Lease not renewed keeps standbys out;
	// RenewDeadline how long the leader keeps trying to renew before it
	// stops (shorter, so it stops placing before the Lease can be taken);
	// RetryPeriod how often either tries.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *slog.Logger
}

// run waits for the Lease and runs lead while it holds it, with the leader
// epoch: the Lease's leaseTransitions (which grows with every change of
// holder) + 1 as this process wrote it when it took the Lease. It returns
//   - nil when ctx ends (a signal): lead is stopped first, then the Lease
//     is released, so a standby takes over at once;
//   - errLostLeadership when the Lease could not be renewed: lead's ctx is
//     cancelled at once, and run returns once lead has;
//   - lead's error when lead fails (the Lease is released).
func (e election) run(ctx context.Context, lead func(ctx context.Context, epoch uint64) error) error {
	log := e.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lock := &epochLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
		Client:     e.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}}
	// electCtx ends the election: on a signal, once lead has stopped, so
	// the Lease is released after the last placement, not before.
	electCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElection()
	stopOnSignal := context.AfterFunc(ctx, func() {
		if !lock.acquired() {
			stopElection() // nothing to stop first
		}
	})
	defer stopOnSignal()

	var leadErr error
	led := make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: e.LeaseDuration,
		RenewDeadline: e.RenewDeadline,
		RetryPeriod:   e.RetryPeriod,
		// SIGTERM hands over at once.
		ReleaseOnCancel: true,
		Name:            e.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				defer close(led)
				// Stopped (a signal, a failure, a lost Lease): give the
				// Lease up.
				defer stopElection()
				epoch := lock.epoch()
				log.Info("leading the virtual node", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity, "epoch", epoch)
				// lctx ends when the Lease is lost; a signal stops lead too.
				lctx, cancel := context.WithCancel(lctx)
				defer cancel()
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
				leadErr = lead(lctx, epoch)
			},
			OnStoppedLeading: func() {
				if lock.acquired() && ctx.Err() == nil {
					log.Warn("stopped leading the virtual node", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
				}
			},
			OnNewLeader: func(id string) {
				if id != e.Identity {
					log.Info("standing by: another replica leads the virtual node", "lease", e.Namespace+"/"+e.Name, "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	log.Info("standing by for the leader Lease", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
	le.Run(electCtx)
	if !lock.acquired() {
		return nil // a signal before this replica led
	}
	<-led // le.Run does not wait for OnStartedLeading
	switch {
	case leadErr != nil:
		return leadErr
	case ctx.Err() != nil:
		return nil // a signal: lead stopped, then the Lease was released
	}
	return errLostLeadership
}

// epochLock remembers the leader record this process last wrote, for its
// leaseTransitions: the leader epoch.
type epochLock struct {
	resourcelock.Interface

	// mu guards transitions and held.
	mu          sync.Mutex
	transitions int
	// held: this process has written itself into the Lease as holder
	// (it leads, or led).
	held bool
}

func (l *epochLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, ler)
	l.wrote(ler, err)
	return err
}

func (l *epochLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, ler)
	l.wrote(ler, err)
	return err
}

func (l *epochLock) wrote(ler resourcelock.LeaderElectionRecord, err error) {
	if err != nil || ler.HolderIdentity != l.Identity() {
		return
	}
	l.mu.Lock()
	l.transitions, l.held = ler.LeaderTransitions, true
	l.mu.Unlock()
}

// acquired: this process has taken the Lease at some point.
func (l *epochLock) acquired() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// epoch is the leader epoch of this process: leaseTransitions + 1 (the
// first leader of a new Lease has 0 transitions; 0 means no epoch).
func (l *epochLock) epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return uint64(l.transitions) + 1
}

// leaseIdentity is this process's identity in the Lease: the pod name (or
// the host name) and a random suffix, so a restarted pod is a new holder.
func leaseIdentity(podName string) string {
	if podName == "" {
		podName, _ = os.Hostname()
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return strings.TrimSpace(podName) + "_" + hex.EncodeToString(b)
}

// inClusterNamespaceFile names the namespace a pod runs in.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// leaseNamespace is where the leader Lease lives: the flag, else the pod's
// namespace (POD_NAMESPACE from the downward API, or the service account's).
func leaseNamespace(flag, podNamespace string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if podNamespace != "" {
		return podNamespace, nil
	}
	if b, err := os.ReadFile(inClusterNamespaceFile); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b)), nil
	}
	return "", errors.New("--leader-elect needs --leader-elect-namespace (or POD_NAMESPACE, or running in a pod)")
}

// agentClients are the node API clients of the agents the pool follows,
// by worker: a new leader claims each with its epoch.
type agentClients struct {
	// mu guards byNode.
	mu     sync.Mutex
	byNode map[string]*nodeapi.Client
}

func (a *agentClients) set(node string, c *nodeapi.Client) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byNode == nil {
		a.byNode = map[string]*nodeapi.Client{}
	}
	a.byNode[node] = c
}

// claim tells every agent that this process leads (its epoch, which the
// clients send), 16 at a time, so a deposed leader is refused from now on.
// An agent that does not answer learns the epoch from the first bind or
// release. A newer leader's claim already made means this one is deposed.
func (a *agentClients) claim(ctx context.Context, log *slog.Logger) error {
	a.mu.Lock()
	clients := make(map[string]*nodeapi.Client, len(a.byNode))
	for n, c := range a.byNode {
		clients[n] = c
	}
	a.mu.Unlock()
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for n, c := range clients {
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			err := c.Claim(cctx)
			switch {
			case errors.Is(err, nodeapi.ErrStaleLeader):
				return fmt.Errorf("node agent %s: %w", n, err)
			case err != nil:
				log.Warn("node agent did not take the new leader's epoch; its first bind or release will", "node", n, "err", err)
			}
			return nil
		})
	}
	return g.Wait()
}
