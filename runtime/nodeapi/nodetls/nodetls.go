// Package nodetls is the node API's mutual TLS: a pool CA that only
// sandman-vk holds, the control plane's short-lived client certificates
// issued from it, and each node agent's serving certificate, requested
// through the cluster's CSR API (signer SignerName) and signed by
// sandman-vk once it has checked the requester is a pod of the sandman-node
// DaemonSet on that node.
//
// Who can do what:
//   - A node agent's certificate names its node (CN AgentCN(node), DNS name
//     node) and is for server auth only: it cannot call any agent's node API.
//   - A control-plane certificate (CN ControlPlaneCN, O ControlPlaneGroup,
//     client auth only) is what an agent accepts as a caller; sandman-vk
//     issues it to itself from the pool CA and keeps its key in memory.
//   - sandman-vk dials an agent expecting a certificate for that agent's
//     node, so a pod of another worker, or one that is not the DaemonSet's,
//     cannot stand in for it.
package nodetls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"sync"
	"time"
)

const (
	// SignerName is the CSR signer of node agents' serving certificates.
	SignerName = "sandman.io/node-agent"
	// ControlPlaneCN is the common name of the control plane's client
	// certificates, the only callers node agents accept.
	ControlPlaneCN = "sandman-vk"
	// ControlPlaneGroup is their organization.
	ControlPlaneGroup = "sandman.io:control-plane"
	// agentCNPrefix prefixes a node agent's common name.
	agentCNPrefix = "sandman-node:"
	// caLifetime is how long a pool CA made here is valid.
	caLifetime = 10 * 365 * 24 * time.Hour
	// clientLifetime is how long a control-plane client certificate is
	// valid; it is replaced after half of it.
	clientLifetime = 24 * time.Hour
	// clockSkew backdates certificates a little, for clocks that differ.
	clockSkew = 5 * time.Minute
)

// AgentCN is the common name of the node agent of node.
func AgentCN(node string) string { return agentCNPrefix + node }

// CA is the pool's certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA makes a CA with a fresh P-256 key, named after the pool.
func NewCA(pool string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		// A distinct name per CA: during a rotation an agent names the CA
		// it trusts, and sandman-vk picks its client certificate by it.
		Subject:               pkix.Name{CommonName: fmt.Sprintf("sandman node API CA (pool %s, %x)", pool, serial().Bytes()[:4]), Organization: []string{"sandman.io"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// ParseCA reads a CA certificate and its key (PKCS#8, EC or PKCS#1 PEM).
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("node API CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("node API CA: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("node API CA: the certificate is not a CA (basic constraints)")
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("node API CA: the key cannot sign")
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Pool is a cert pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// IssueClient issues a control-plane client certificate with a new key.
func (ca *CA) IssueClient(lifetime time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: ControlPlaneCN, Organization: []string{ControlPlaneGroup}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// CheckAgentRequest checks that a CSR asks for exactly the node agent
// certificate of node: CN AgentCN(node), DNS name node, IP addresses among
// ips, nothing else, and that it is signed by its key.
func CheckAgentRequest(csr *x509.CertificateRequest, node string, ips []net.IP) error {
	if err := csr.CheckSignature(); err != nil {
		return fmt.Errorf("the request's signature: %w", err)
	}
	if csr.Subject.CommonName != AgentCN(node) {
		return fmt.Errorf("common name %q: the agent on node %s may only ask for %q", csr.Subject.CommonName, node, AgentCN(node))
	}
	if len(csr.Subject.Organization) > 0 || len(csr.Subject.OrganizationalUnit) > 0 {
		return fmt.Errorf("organization %q: a node agent certificate has none", csr.Subject.Organization)
	}
	if len(csr.DNSNames) != 1 || csr.DNSNames[0] != node {
		return fmt.Errorf("DNS names %q: want exactly [%s]", csr.DNSNames, node)
	}
	if len(csr.EmailAddresses) > 0 || len(csr.URIs) > 0 {
		return errors.New("email addresses or URIs: a node agent certificate has none")
	}
	if len(csr.IPAddresses) == 0 {
		return errors.New("no IP address: sandman-vk dials the agent's address")
	}
	for _, ip := range csr.IPAddresses {
		if !slices.ContainsFunc(ips, ip.Equal) {
			return fmt.Errorf("IP address %s is not one of the agent pod's %v", ip, ips)
		}
	}
	return nil
}

// SignAgent signs a checked agent request (CheckAgentRequest) for lifetime
// and returns the PEM chain: the certificate, then the CA, which is how the
// agent learns whom to trust as its callers.
func (ca *CA) SignAgent(csr *x509.CertificateRequest, lifetime time.Duration) ([]byte, error) {
	now := time.Now()
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: csr.Subject.CommonName},
		DNSNames:     csr.DNSNames,
		IPAddresses:  csr.IPAddresses,
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return append(out, ca.CertPEM...), nil
}

// Authority is the pool CA as sandman-vk holds it: the current CA, which
// signs agents' certificates and sandman-vk's own, and during a rotation the
// previous one, still trusted and still used towards agents whose
// certificate it signed (until they renew). Safe for concurrent use.
type Authority struct {
	mu       sync.Mutex
	cur      *CA
	prev     *CA
	lifetime time.Duration
	// clients: the control-plane client certificate issued from each CA.
	clients map[*CA]*tls.Certificate
}

// NewAuthority returns an Authority with current (required) and previous
// (nil: none) CAs.
func NewAuthority(current, previous *CA) (*Authority, error) {
	a := &Authority{lifetime: clientLifetime}
	if err := a.Set(current, previous); err != nil {
		return nil, err
	}
	return a, nil
}

// Set replaces the CAs (a rotation); connections made from now on use them.
func (a *Authority) Set(current, previous *CA) error {
	if current == nil {
		return errors.New("node API CA: the current CA is required")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cur, a.prev = current, previous
	a.clients = map[*CA]*tls.Certificate{}
	return nil
}

// Current is the CA that signs.
func (a *Authority) Current() *CA {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

// cas are the trusted CAs, current first.
func (a *Authority) cas() []*CA {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.prev != nil {
		return []*CA{a.cur, a.prev}
	}
	return []*CA{a.cur}
}

// clientCert is the client certificate from the first CA the agent
// accepts (acceptable: the DER subjects of its client CAs; none named: the
// current CA), issued anew after half its lifetime.
func (a *Authority) clientCert(acceptable [][]byte) (*tls.Certificate, error) {
	cas := a.cas()
	ca := cas[0]
	for _, c := range cas {
		if slices.ContainsFunc(acceptable, func(s []byte) bool { return string(s) == string(c.Cert.RawSubject) }) {
			ca = c
			break
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur := a.clients[ca]; cur != nil && time.Until(cur.Leaf.NotAfter) > a.lifetime/2 {
		return cur, nil
	}
	cert, err := ca.IssueClient(a.lifetime)
	if err != nil {
		return nil, fmt.Errorf("node API client certificate: %w", err)
	}
	if a.clients != nil {
		a.clients[ca] = cert
	}
	return cert, nil
}

// TLSConfig is the configuration to dial the agent of node: its
// certificate must chain to a trusted CA (current or previous) and name
// node; the client certificate comes from the CA the agent trusts.
func (a *Authority) TLSConfig(node string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is verified in VerifyConnection against the CAs of the
		// moment, which a rotation changes.
		InsecureSkipVerify: true, //nolint:gosec // verified below
		GetClientCertificate: func(info *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return a.clientCert(info.AcceptableCAs)
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("node %s's agent presented no certificate", node)
			}
			roots := x509.NewCertPool()
			for _, ca := range a.cas() {
				roots.AddCert(ca.Cert)
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: node,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("node %s's agent certificate: %w", node, err)
			}
			if leaf.Subject.CommonName != AgentCN(node) {
				return fmt.Errorf("the node API at this address is not node %s's agent (%q)", node, leaf.Subject.CommonName)
			}
			return nil
		},
	}
}

// ServerTLS is a node agent's server configuration: current is its
// certificate chain (the certificate, then the pool CA, as SignAgent
// returns it; nil while it has none). Callers must present a
// control-plane certificate from that CA to use the API (CheckCaller).
func ServerTLS(current func() *tls.Certificate, node string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert := current()
			if cert == nil {
				return nil, fmt.Errorf("node agent %s has no node API certificate yet (its CSR for signer %s waits for sandman-vk)", node, SignerName)
			}
			if len(cert.Certificate) < 2 {
				return nil, fmt.Errorf("node agent %s's certificate comes without the pool CA", node)
			}
			cas := x509.NewCertPool()
			for _, der := range cert.Certificate[1:] {
				ca, err := x509.ParseCertificate(der)
				if err != nil {
					return nil, fmt.Errorf("node agent %s's certificate chain: %w", node, err)
				}
				cas.AddCert(ca)
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{*cert},
				// A certificate, when given, must chain to the pool CA with
				// client-auth usage (an agent's own is refused here); the
				// node API then takes only the control plane's
				// (CheckCaller), while /healthz and /metrics stay open.
				ClientAuth: tls.VerifyClientCertIfGiven,
				ClientCAs:  cas,
			}, nil
		},
	}
}

// CheckCaller accepts only a verified control-plane certificate.
func CheckCaller(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return errors.New("the node API takes only the control plane's client certificate")
	}
	leaf := cs.VerifiedChains[0][0]
	if leaf.Subject.CommonName != ControlPlaneCN || !slices.Contains(leaf.Subject.Organization, ControlPlaneGroup) {
		return fmt.Errorf("client certificate %q is not the control plane's: the node API takes only sandman-vk", leaf.Subject.CommonName)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}
