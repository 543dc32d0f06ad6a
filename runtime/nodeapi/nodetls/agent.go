package nodetls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate"
	"k8s.io/klog/v2"

	"github.com/sandman-dev/sandman/internal/certstore"
)

// AgentLifetime is the lifetime a node agent asks for; client-go's
// certificate manager renews at 70–90 % of it.
const AgentLifetime = 7 * 24 * time.Hour

// AgentCerts keeps a node agent's node API certificate, requested with the
// agent pod's ServiceAccount (a CSR for SignerName, which sandman-vk signs)
// and renewed before it expires. The key stays in memory: a restarted agent
// asks again.
type AgentCerts struct {
	node  string
	store *certstore.Memory
	certs certificate.Manager
}

// NewAgentCerts prepares the certificate of node's agent, reachable at ips.
// It makes no request until Start.
func NewAgentCerts(client kubernetes.Interface, node string, ips []net.IP, log *slog.Logger) (*AgentCerts, error) {
	if node == "" || len(ips) == 0 {
		return nil, errors.New("node API certificate: a node name and at least one IP address are required")
	}
	a := &AgentCerts{node: node, store: certstore.New("node API certificate")}
	logCtx := klog.NewContext(context.Background(), logr.FromSlogHandler(log.With("component", "node-api-cert").Handler()))
	lifetime := AgentLifetime
	var err error
	a.certs, err = certificate.NewManager(&certificate.Config{
		ClientsetFn: func(*tls.Certificate) (kubernetes.Interface, error) { return client, nil },
		Template: &x509.CertificateRequest{
			Subject:     pkix.Name{CommonName: AgentCN(node)},
			DNSNames:    []string{node},
			IPAddresses: ips,
		},
		SignerName: SignerName,
		Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment,
			certificatesv1.UsageServerAuth},
		RequestedCertificateLifetime: &lifetime,
		CertificateStore:             a.store,
		Name:                         "sandman-node-api",
		Ctx:                          &logCtx,
	})
	if err != nil {
		return nil, fmt.Errorf("node API certificate: %w", err)
	}
	return a, nil
}

// Start requests the certificate and keeps it renewed until Stop.
func (a *AgentCerts) Start() { a.certs.Start() }

// Stop ends renewal.
func (a *AgentCerts) Stop() { a.certs.Stop() }

// Current is the certificate chain to serve, nil while there is none.
func (a *AgentCerts) Current() *tls.Certificate { return a.certs.Current() }

// Wait blocks until the first certificate is issued or ctx ends.
func (a *AgentCerts) Wait(ctx context.Context) error {
	select {
	case <-a.store.Issued():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no node API certificate for node %s yet: its CertificateSigningRequest (signer %s) waits for sandman-vk to check and sign it", a.node, SignerName)
	}
}

// TLSConfig is the agent's server configuration (ServerTLS).
func (a *AgentCerts) TLSConfig() *tls.Config { return ServerTLS(a.Current, a.node) }
