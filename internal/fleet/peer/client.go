package peer

import (
	"crypto/ed25519"
	"crypto/tls"

	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/tlskey"
)

// ClientConfig is the TLS configuration of a connection to the peer
// listener of the host whose key id is server (tlskey.ClientConfig): it
// presents a certificate of our host key, remade before it runs out, and
// refuses any server that does not hold server's key (ErrPin). Every
// connection is a full TLS 1.3 handshake.
func ClientConfig(key ed25519.PrivateKey, server record.Address) *tls.Config {
	return tlskey.ClientConfig(newCertSource(key).get, server)
}
