package daemon

import (
	"context"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// keys is the host's trusted-key set (internal/trust), made from the
// daemon's store and key id at each use.
func (d *Daemon) keys() trust.Keys { return trust.Keys{Store: d.st, Self: d.keyID, Log: d.log} }

// trusted says whether a host key id is trusted here: trusted on this host
// (internal/trust), or, in a fleet, admitted to it as a host (its keys are
// the fleet's trusted set, docs/fleet.md).
func (d *Daemon) trusted(key record.Address) bool {
	if d.keys().Trusted(key) {
		return true
	}
	h := d.session()
	if h == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := h.Member(ctx, key)
	return err == nil && m.Role == fleet.RoleHost
}

// Trust trusts a host key under name: bundles whose attestations it signed
// may be imported.
func (d *Daemon) Trust(key, name string) (trust.Key, error) { return d.keys().Add(key, name) }

// Untrust stops trusting a host key. Runs already imported stay.
func (d *Daemon) Untrust(key string) error { return d.keys().Remove(key) }

// TrustedKeys lists the trusted host keys, this host's first.
func (d *Daemon) TrustedKeys() ([]trust.Key, error) { return d.keys().List() }

// signersOf is a record's signers, with their names.
func (d *Daemon) signersOf(ss []attest.Signer) []Signer { return d.keys().Names(ss) }

// grantsOf returns an imported bundle's grants as a copy (Import's
// answer).
func grantsOf(g unit.Grants) unit.Grants {
	g.ReadOnly = append([]unit.Mount(nil), g.ReadOnly...)
	return g
}
