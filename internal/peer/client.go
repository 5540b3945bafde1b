package peer

import (
	"crypto/ed25519"
	"crypto/tls"
	"fmt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// ClientConfig is the TLS configuration of a connection to the peer
// listener of the host whose key id is server: it presents a certificate
// of our host key, and refuses any server that does not hold server's
// key (ErrPin). Every connection is a full TLS 1.3 handshake.
func ClientConfig(key ed25519.PrivateKey, server record.Address) *tls.Config {
	certs := newCertSource(key)
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return certs.get()
		},
		// There is no CA to verify a chain against: every host's
		// certificate is self-signed by its host key. The standard
		// verification (chain to a root, host name, dates) is skipped and
		// VerifyConnection below is the whole check: the server's one
		// certificate must carry the pinned ed25519 key. Right after it,
		// the handshake checks the server's CertificateVerify signature
		// against that key, and fails unless the server holds it. The pin
		// is the trust.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			got, err := keyOf(cs.PeerCertificates)
			if err != nil {
				return fmt.Errorf("peer: server %s: %w", server, err)
			}
			if got != server {
				return fmt.Errorf("peer: server presents %s, pinned %s: %w", got, server, ErrPin)
			}
			return nil
		},
	}
}
