package peer

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Conns are the peer listener's open connections by the key their
// handshake admitted, so that a key the fleet revokes loses them at once
// (Cut): an admission holds for its connection, and a revocation must
// not wait for the connection to end by itself. Track is the
// http.Server's ConnState hook. Safe for concurrent use.
type Conns struct {
	mu    sync.Mutex
	byKey map[record.Address]map[net.Conn]bool
	keyOf map[net.Conn]record.Address
	// cut are the keys cut and not admitted again since: a connection
	// whose handshake came before the revocation and whose first request
	// comes after it is closed as it becomes active.
	cut map[record.Address]bool
}

// Track follows c through its states (http.Server.ConnState): once a
// request has been read on it (its handshake is done) it is known by its
// admitted key, and forgotten when closed or hijacked.
func (cs *Conns) Track(c net.Conn, state http.ConnState) {
	switch state {
	case http.StateActive:
		tc, ok := c.(*tls.Conn)
		if !ok {
			return
		}
		st := tc.ConnectionState()
		if len(st.PeerCertificates) != 1 {
			return
		}
		v, ok := recall(st.PeerCertificates[0])
		if !ok {
			return
		}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.cut[v.key] {
			_ = c.Close()
			return
		}
		if cs.byKey == nil {
			cs.byKey, cs.keyOf = map[record.Address]map[net.Conn]bool{}, map[net.Conn]record.Address{}
		}
		if _, known := cs.keyOf[c]; known {
			return
		}
		if cs.byKey[v.key] == nil {
			cs.byKey[v.key] = map[net.Conn]bool{}
		}
		cs.byKey[v.key][c], cs.keyOf[c] = true, v.key
	case http.StateClosed, http.StateHijacked:
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if key, ok := cs.keyOf[c]; ok {
			delete(cs.keyOf, c)
			delete(cs.byKey[key], c)
			if len(cs.byKey[key]) == 0 {
				delete(cs.byKey, key)
			}
		}
	}
}

// Cut closes every open connection of key, and returns how many: a
// request in flight on one fails. Until Admitted(key), a connection of key
// that becomes active is closed too.
func (cs *Conns) Cut(key record.Address) int {
	cs.mu.Lock()
	if cs.cut == nil {
		cs.cut = map[record.Address]bool{}
	}
	cs.cut[key] = true
	conns := cs.byKey[key]
	delete(cs.byKey, key)
	for c := range conns {
		delete(cs.keyOf, c)
	}
	cs.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	return len(conns)
}

// Admitted lifts Cut's mark: key is admitted again (its new handshakes
// were checked against the directory all along).
func (cs *Conns) Admitted(key record.Address) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	delete(cs.cut, key)
}

// Keys are the keys with open connections.
func (cs *Conns) Keys() []record.Address {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := make([]record.Address, 0, len(cs.byKey))
	for k := range cs.byKey {
		out = append(out, k)
	}
	return out
}
