// Package peer is the fleet's mutual TLS: between hosts (peers), and
// between a remote agent platform and a host. There is no CA: each side
// is its ed25519 host key (attest.LoadOrCreateKey), known by its key id
// (attest.KeyID), and presents a self-signed X.509 certificate of that
// key, made in memory (valid [CertValidity], remade before it runs out).
//
// # Server
//
// [ServerConfig] requires a client certificate and admits the client in
// the handshake only if [Admitted] (in production [Members] of the
// fleet's [fleet.Dir]: an etcd read per handshake, through a [Gate])
// names its key with a role, host or platform. A key the fleet does not admit, a certificate
// that is not one ed25519 certificate, and an admission etcd could not
// confirm are refused with a [*RefusedError] (safety over liveness: an
// unconfirmed key is refused, never admitted). [Require] then allows a
// route to one role only, answering 403 with an api.Error of code
// [CodeForbidden] otherwise; [KeyOf] gives a handler the key and role.
// [Listen] serves a ServerConfig on a TCP address, within [Limits]:
// connections in total and per source (an IPv4 address, an IPv6 /64), and a deadline on each
// handshake, its admission included.
//
// # Client
//
// [ClientConfig] presents our certificate and pins the server's key id:
// a server that does not hold that key is refused ([ErrPin]). [Hosts] is
// the client of the peer routes (internal/server serves them, with this
// package's wire types): a migration handed over, a received run's record
// and objects fetched (internal/fleet/transfer), a host's offer asked.
//
// # Caveats
//
//   - The admission is the handshake's: a connection admitted keeps its
//     verdict until it closes. A key no longer admitted is refused at its
//     next handshake; the server bounds how long connections live.
//   - A [Gate] bounds the admission reads: one per key at a time, at most
//     16 at once, and a key refused as not admitted is refused without a
//     read for 30 s (a key admitted meanwhile waits that long). A key
//     that is admitted is read afresh at every handshake.
//   - Certificate dates, issuers and chains are not checked: the pinned
//     or admitted key is the whole trust, and the TLS 1.3 handshake
//     proves the peer holds it.
//
// docs/fleet.md, "Peer listener and keys", says the same for operators.
package peer
