package peer

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
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

// selfSigned makes a certificate of key signed by key: its subject's
// common name is the key id, it may authenticate servers and clients,
// and it is valid from now-certBackdate to now+CertValidity.
func selfSigned(key ed25519.PrivateKey, now time.Time) (*tls.Certificate, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("peer: host key is not an ed25519 private key")
	}
	pub := key.Public().(ed25519.PublicKey)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: attest.KeyID(pub).String()},
		NotBefore:             now.Add(-certBackdate),
		NotAfter:              now.Add(CertValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, fmt.Errorf("peer: certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("peer: certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// keyOf returns the key id of a peer's certificates: there must be
// exactly one, carrying an ed25519 public key. Its dates, issuer and
// signature are not looked at: the handshake proved the peer holds the
// key, and the key (by its id) is what is admitted or pinned.
func keyOf(certs []*x509.Certificate) (record.Address, error) {
	if len(certs) != 1 {
		return record.Address{}, fmt.Errorf("%w: %d certificates", ErrCertificate, len(certs))
	}
	pub, ok := certs[0].PublicKey.(ed25519.PublicKey)
	if !ok || len(pub) != ed25519.PublicKeySize {
		return record.Address{}, fmt.Errorf("%w: a %T key", ErrCertificate, certs[0].PublicKey)
	}
	return attest.KeyID(pub), nil
}
