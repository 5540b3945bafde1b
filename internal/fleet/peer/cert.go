package peer

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/tlskey"
)

// Certificate validity. Peers never check it (the pin is the trust, and
// the handshake's signature proves the key is held now); it is short so
// that a certificate copied out of a memory dump or a capture says
// nothing for long, and it is remade in memory before it runs out.
const (
	// CertValidity is how long a certificate is valid from when it is
	// made.
	CertValidity = 24 * time.Hour
	// certBackdate moves NotBefore back, for tools that check it against
	// a clock behind ours.
	certBackdate = time.Hour
	// certRenew: a certificate with less than this left is remade.
	certRenew = time.Hour
)

// certSource hands out a self-signed certificate of the host key, made
// on first use and remade when less than certRenew of it remains.
type certSource struct {
	key ed25519.PrivateKey
	now func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	expires time.Time
}

func newCertSource(key ed25519.PrivateKey) *certSource {
	return &certSource{key: key, now: time.Now}
}

// get returns the current certificate, making one when needed.
func (s *certSource) get() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.cert != nil && now.Add(certRenew).Before(s.expires) {
		return s.cert, nil
	}
	c, err := selfSigned(s.key, now)
	if err != nil {
		return nil, err
	}
	s.cert, s.expires = c, c.Leaf.NotAfter
	return c, nil
}

// selfSigned makes a certificate of key signed by key
// (tlskey.Certificate), valid from now-certBackdate to now+CertValidity.
func selfSigned(key ed25519.PrivateKey, now time.Time) (*tls.Certificate, error) {
	return tlskey.Certificate(key, now.Add(-certBackdate), now.Add(CertValidity))
}

// keyOf returns the key id of a peer's certificates (tlskey.KeyOf).
func keyOf(certs []*x509.Certificate) (record.Address, error) { return tlskey.KeyOf(certs) }
