package main

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes"

	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
	"github.com/sandman-dev/sandman/vk"
)

// agentsConfig is what connectAgents needs besides the flags.
type agentsConfig struct {
	client kubernetes.Interface
	// apiCerts, when set, signs the agents' certificates and makes the
	// node API mutual TLS; otherwise token authenticates to the agents.
	apiCerts *nodetls.Authority
	token    string
	pool     *pool.Pool
	// clients keeps every agent's client, for a new leader's claim;
	// epoch is sent with every node API call.
	clients *agentClients
	epoch   func() uint64
	log     *slog.Logger
}

// connectAgents adds the node agents to the pool: the static --node-agents,
// or those the discovery finds (until ctx ends). With the node API CA it
// also runs the signer of the agents' certificates (on every replica: a
// request decided twice is a conflict, and the second one stops).
func connectAgents(ctx context.Context, o options, c agentsConfig) error {
	owner := vk.AgentOwner{Namespace: o.agentNamespace, DaemonSet: o.agentDaemonSet, ServiceAccount: o.agentServiceAccount}
	if c.apiCerts != nil {
		signer, err := vk.NewAgentSigner(vk.AgentSignerConfig{Client: c.client, CA: c.apiCerts.Current, Owner: owner, Logger: c.log})
		if err != nil {
			return err
		}
		go func() {
			if err := signer.Run(ctx); err != nil {
				c.log.Error("node agent certificate signer", "err", err)
			}
		}()
	}
	connect := func(a vk.Agent) {
		c.log.Info("node agent", "node", a.Name, "addr", a.Addr)
		var nc *nodeapi.Client
		if c.apiCerts != nil {
			nc = nodeapi.NewTLSClient(a.Addr, c.apiCerts.TLSConfig(a.Name))
		} else {
			nc = nodeapi.NewClient(a.Addr, c.token, nil)
		}
		nc.WithLeaderEpoch(c.epoch)
		c.clients.set(a.Name, nc)
		c.pool.AddNode(ctx, a.Name, nc)
	}
	if o.agents != "" {
		agents, err := vk.ParseAgents(o.agents)
		if err != nil {
			return fmt.Errorf("--node-agents: %w", err)
		}
		for _, a := range agents {
			connect(a)
		}
		return nil
	}
	if err := vk.DiscoverAgents(ctx, c.client, owner, o.agentSelector, o.agentPort, c.log, connect); err != nil {
		return fmt.Errorf("discover node agents: %w", err)
	}
	return nil
}
