package kubeletcert

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"

	"k8s.io/client-go/util/certificate"
)

// memoryStore keeps the current key pair in memory (certificate.Store): a
// restarted sandman-vk asks for a new certificate, which takes a second or
// two, and no key touches a disk.
type memoryStore struct {
	// issued is closed at the first Update.
	issued chan struct{}

	// mu guards cert.
	mu   sync.Mutex
	cert *tls.Certificate
}

var _ certificate.Store = (*memoryStore)(nil)

func newMemoryStore() *memoryStore { return &memoryStore{issued: make(chan struct{})} }

// Current implements certificate.Store.
func (s *memoryStore) Current() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		err := certificate.NoCertKeyError("no kubelet serving certificate yet")
		return nil, &err
	}
	return s.cert, nil
}

// Update implements certificate.Store.
func (s *memoryStore) Update(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("issued certificate: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("issued certificate: %w", err)
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

// pemBlock returns the DER bytes of a PEM "CERTIFICATE REQUEST" block.
func pemBlock(b []byte) ([]byte, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("the request is not a PEM CERTIFICATE REQUEST block")
	}
	return block.Bytes, nil
}
