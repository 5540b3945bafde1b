// Package tlskey is an ed25519 key's identity in TLS, as the fleet's
// mutual-TLS listener (serve --peer-listen) knows hosts and platforms: a
// certificate self-signed by the key, naming its key id, and the key a
// peer's certificate carries. There is no certificate authority: each
// side pins the other's key, and the handshake's signature proves the
// key is held. Dates, issuers and names are never checked.
package tlskey

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

var (
	// ErrCertificate: the peer did not present exactly one certificate
	// carrying an ed25519 public key. A chain, an RSA or ECDSA key, or
	// no certificate at all is refused: a peer is its key.
	ErrCertificate = errors.New("peer certificate is not one ed25519 certificate")
	// ErrPin: the server presented another key than the one the client
	// pinned.
	ErrPin = errors.New("server key is not the pinned key")
)

// Certificate makes a certificate of key signed by key, valid from
// notBefore to notAfter: its subject's common name is the key id, and it
// may authenticate servers and clients.
func Certificate(key ed25519.PrivateKey, notBefore, notAfter time.Time) (*tls.Certificate, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("tlskey: not an ed25519 private key")
	}
	pub := key.Public().(ed25519.PublicKey)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: attest.KeyID(pub).String()},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, fmt.Errorf("tlskey: certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlskey: certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// KeyOf returns the key id of a peer's certificates: there must be
// exactly one, carrying an ed25519 public key (else ErrCertificate). Its
// dates, issuer and signature are not looked at: the handshake proves the
// peer holds the key, and the key (by its id) is what is admitted or
// pinned.
func KeyOf(certs []*x509.Certificate) (record.Address, error) {
	if len(certs) != 1 {
		return record.Address{}, fmt.Errorf("%w: %d certificates", ErrCertificate, len(certs))
	}
	pub, ok := certs[0].PublicKey.(ed25519.PublicKey)
	if !ok || len(pub) != ed25519.PublicKeySize {
		return record.Address{}, fmt.Errorf("%w: a %T key", ErrCertificate, certs[0].PublicKey)
	}
	return attest.KeyID(pub), nil
}

// ClientConfig is the TLS configuration of a connection to the
// mutual-TLS listener of the host whose key id is server: it presents
// the certificate cert returns (called at each handshake), and refuses
// any server that does not hold server's key (ErrPin). Every connection
// is a full TLS 1.3 handshake.
func ClientConfig(cert func() (*tls.Certificate, error), server record.Address) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		GetClientCertificate:   func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert() },
		// There is no CA to verify a chain against: every certificate is
		// self-signed by its key. The standard verification (chain to a
		// root, host name, dates) is skipped and VerifyConnection below is
		// the whole check: the server's one certificate must carry the
		// pinned ed25519 key. Right after it, the handshake checks the
		// server's CertificateVerify signature against that key, and fails
		// unless the server holds it. The pin is the trust.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			got, err := KeyOf(cs.PeerCertificates)
			if err != nil {
				return fmt.Errorf("tlskey: server %s: %w", server, err)
			}
			if got != server {
				return fmt.Errorf("tlskey: server presents %s, pinned %s: %w", got, server, ErrPin)
			}
			return nil
		},
	}
}
