package peer

import (
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/tlskey"
)

// The errors of the peer listener and its clients. A handshake the server
// refuses returns a [*RefusedError] wrapping one of the first three.
var (
	// ErrCertificate: the peer did not present exactly one certificate
	// carrying an ed25519 public key. A chain, an RSA or ECDSA key, or
	// no certificate at all is refused: a peer is its host key.
	ErrCertificate = tlskey.ErrCertificate
	// ErrNotAdmitted: the fleet does not admit the client's key (or
	// admits it with a role this package does not know). It is
	// fleet.ErrNotAdmitted.
	ErrNotAdmitted = fleet.ErrNotAdmitted
	// ErrUnconfirmed: the admission check did not answer (etcd
	// unreachable, no quorum, a malformed entry, its deadline passed).
	// The handshake is refused: safety over liveness. The error of the
	// check is wrapped too (fleet.ErrUnavailable, usually).
	ErrUnconfirmed = errors.New("peer admission not confirmed")
	// ErrPin: the server presented another key than the one the client
	// pinned (ClientConfig).
	ErrPin = tlskey.ErrPin
)

// RefusedError is a handshake the server refused: which key (zero when
// the certificate carried none) and why (Err wraps ErrCertificate,
// ErrNotAdmitted or ErrUnconfirmed).
type RefusedError struct {
	Key record.Address
	Err error
}

func (e *RefusedError) Error() string {
	if e.Key.IsZero() {
		return "peer: handshake refused: " + e.Err.Error()
	}
	return fmt.Sprintf("peer: handshake of %s refused: %v", e.Key, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }
