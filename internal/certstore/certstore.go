// Package certstore is an in-memory certificate.Store for client-go's
// certificate manager: a restarted process asks for a new certificate,
// which takes a second or two, and no key touches a disk.
package certstore

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"

	"k8s.io/client-go/util/certificate"
)

// Memory keeps the current key pair in memory. Safe for concurrent use.
type Memory struct {
	what string
	// issued is closed at the first Update.
	issued chan struct{}

	// mu guards cert.
	mu   sync.Mutex
	cert *tls.Certificate
}

var _ certificate.Store = (*Memory)(nil)

// New returns an empty store; what names the certificate in errors.
func New(what string) *Memory { return &Memory{what: what, issued: make(chan struct{})} }

// Issued is closed once the first certificate is stored.
func (s *Memory) Issued() <-chan struct{} { return s.issued }

// Current implements certificate.Store.
func (s *Memory) Current() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		err := certificate.NoCertKeyError("no " + s.what + " yet")
		return nil, &err
	}
	return s.cert, nil
}

// Update implements certificate.Store.
func (s *Memory) Update(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("issued %s: %w", s.what, err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("issued %s: %w", s.what, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		close(s.issued)
	}
	s.cert = &c
	return &c, nil
}
