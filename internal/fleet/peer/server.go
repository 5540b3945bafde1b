package peer

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// AdmitTimeout bounds the admission check of one handshake, its wait for
// a read included. (A [fleet.Dir] bounds its own requests too, and the
// listener the whole handshake, [Limits]; the shortest wins.)
const AdmitTimeout = 5 * time.Second

// Admitted answers whether the fleet admits a key, and with which role.
// A key it does not admit is an error wrapping fleet.ErrNotAdmitted; any
// other error means it could not tell, and the handshake is refused as
// unconfirmed. It is called once per handshake, concurrently.
type Admitted func(ctx context.Context, key record.Address) (fleet.Role, error)

// Members admits the keys admitted in the fleet's directory, with their
// roles ([fleet.Dir.Member]: a linearizable read of etcd), through a
// [Gate] with its defaults: one read per key at a time, a refusal
// remembered for 30 s, 16 reads at once.
func Members(d *fleet.Dir) Admitted {
	return Gate(func(ctx context.Context, key record.Address) (fleet.Role, error) {
		m, err := d.Member(ctx, key)
		if err != nil {
			return "", err
		}
		return m.Role, nil
	}, GateLimits{})
}

// ServerConfig is the peer listener's TLS configuration: it presents a
// certificate of the host key, requires one of every client, and admits
// the client only if admitted names its key with a known role. Every
// connection is a full TLS 1.3 handshake (no session resumption), so
// every connection proves its key afresh and is checked afresh.
//
// admitted must not be nil. Serve the configuration as it is: a
// certificate added to Certificates would be served instead of the host
// key's to clients that send no server name.
func ServerConfig(key ed25519.PrivateKey, admitted Admitted) *tls.Config {
	if admitted == nil {
		panic("peer: ServerConfig without an admission check")
	}
	certs := newCertSource(key)
	cfg := &tls.Config{
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		ClientAuth:             tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return certs.get()
		},
		// VerifyConnection, not VerifyPeerCertificate: it sees the parsed
		// certificates (whose verdict KeyOf finds again) and would also
		// run on a resumed session.
		VerifyConnection: func(cs tls.ConnectionState) error {
			return admit(context.Background(), admitted, cs.PeerCertificates)
		},
	}
	// Each handshake's admission is bounded by the handshake's context
	// too (Listen's deadline): a client whose handshake is cut stops
	// waiting for an admission read.
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c := cfg.Clone()
		c.GetConfigForClient = nil
		ctx := hello.Context()
		c.VerifyConnection = func(cs tls.ConnectionState) error { return admit(ctx, admitted, cs.PeerCertificates) }
		return c, nil
	}
	return cfg
}

// admit checks the client's certificates against admitted and keeps the
// verdict for KeyOf. crypto/tls calls it when the certificate arrives,
// before it checks the client's CertificateVerify signature: a client
// that does not hold the key fails the handshake right after, and its
// verdict, never reachable by a request, is collected with its
// certificate.
func admit(ctx context.Context, admitted Admitted, certs []*x509.Certificate) error {
	key, err := keyOf(certs)
	if err != nil {
		return &RefusedError{Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, AdmitTimeout)
	defer cancel()
	role, err := admitted(ctx, key)
	switch {
	case errors.Is(err, fleet.ErrNotAdmitted):
		return &RefusedError{Key: key, Err: err}
	case err != nil:
		return &RefusedError{Key: key, Err: fmt.Errorf("%w: %w", ErrUnconfirmed, err)}
	case role != fleet.RoleHost && role != fleet.RolePlatform:
		return &RefusedError{Key: key, Err: fmt.Errorf("%w: role %q", ErrNotAdmitted, role)}
	}
	remember(certs[0], verdict{key: key, role: role})
	return nil
}

// verdict is what a handshake established about its client.
type verdict struct {
	key  record.Address
	role fleet.Role
}

// verdicts holds the verdict of every handshake a ServerConfig of this
// process admitted, keyed by the client's certificate as parsed for
// that connection: net/http hands requests the very same
// *x509.Certificate in r.TLS, so a request finds the verdict of its own
// connection's handshake, and of no other. The key is weak, and the
// entry goes when the connection's certificate is collected.
var verdicts sync.Map // weak.Pointer[x509.Certificate] → verdict

func remember(leaf *x509.Certificate, v verdict) {
	wp := weak.Make(leaf)
	verdicts.Store(wp, v)
	runtime.AddCleanup(leaf, func(wp weak.Pointer[x509.Certificate]) { verdicts.Delete(wp) }, wp)
}

func recall(leaf *x509.Certificate) (verdict, bool) {
	v, ok := verdicts.Load(weak.Make(leaf))
	if !ok {
		return verdict{}, false
	}
	return v.(verdict), true
}
