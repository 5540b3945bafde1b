package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fleetRevoke is `fleet revoke KEY`: the key's membership removed and its
// session's lease revoked (fleet.Dir.Revoke).
func fleetRevoke(ctx context.Context, e etcdFlags, keyText string) (fleetOutput, error) {
	key, err := trust.ParseKey(keyText)
	if err != nil {
		return nil, usagef("fleet revoke: %v", err)
	}
	dir, cli, err := e.dir()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	m, err := dir.Revoke(ctx, key)
	if err != nil {
		return nil, err
	}
	return fleetRevoked{memberOf(m)}, nil
}

// fleetRevoked is `fleet revoke`'s output: the member as it was; its
// lease, when it had one, is revoked.
type fleetRevoked struct {
	Revoked fleetMember `json:"revoked"`
}

func (r fleetRevoked) table(w io.Writer) {
	session := "no live session"
	if r.Revoked.Lease != "" {
		session = fmt.Sprintf("its session's lease %s revoked", r.Revoked.Lease)
	}
	fmt.Fprintf(w, "revoked %s (%s, %s): %s\n", r.Revoked.Key, printable(r.Revoked.Name), r.Revoked.Role, session)
}

// cutRevoked makes srv, the peer listener's server, track its connections
// by key, and cuts a key's connections as soon as the directory says it
// was revoked, until ctx is done (docs/fleet.md, "Revoking a key").
func cutRevoked(ctx context.Context, dir *fleet.Dir, srv *http.Server, log *slog.Logger) {
	conns := &peer.Conns{}
	srv.ConnState = conns.Track
	revoked := func(key record.Address) {
		n := conns.Cut(key)
		log.Warn("fleet: a key was revoked; its connections are cut", "key", key, "connections", n)
	}
	resync := func() {
		for _, key := range conns.Keys() {
			if _, err := dir.Member(ctx, key); errors.Is(err, fleet.ErrNotAdmitted) {
				revoked(key)
			}
		}
	}
	go dir.WatchRevoked(ctx, revoked, conns.Admitted, resync)
}
