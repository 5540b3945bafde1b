package peer

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// CodeForbidden is the api.Error code of a request whose verified key may
// not use the route (api.CodeForbidden).
const CodeForbidden = api.CodeForbidden

// KeyOf returns the key id and role that the handshake of r's connection
// established. ok is false unless r came over TLS and a [ServerConfig] of
// this process admitted that connection's client: a certificate checked
// by anything else is not believed.
func KeyOf(r *http.Request) (key record.Address, role fleet.Role, ok bool) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) != 1 {
		return record.Address{}, "", false
	}
	v, ok := recall(r.TLS.PeerCertificates[0])
	if !ok {
		return record.Address{}, "", false
	}
	return v.key, v.role, true
}

// Require serves next only to requests whose verified key has role; any
// other gets 403 with an api.Error of code CodeForbidden. A platform key
// cannot act as a peer host, nor a host key as a platform.
func Require(role fleet.Role, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, got, ok := KeyOf(r)
		switch {
		case !ok:
			forbid(w, "no admitted peer key on this connection")
		case got != role:
			forbid(w, fmt.Sprintf("key %s is admitted as %s; this route is for %s keys", key, got, role))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func forbid(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(&api.Error{Code: CodeForbidden, Message: msg})
}
