package daemon

import (
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// keys is the host's trusted-key set (internal/trust), made from the
// daemon's store and key id at each use.
func (d *Daemon) keys() trust.Keys { return trust.Keys{Store: d.st, Self: d.keyID, Log: d.log} }

// trusted says whether a host key id is trusted here.
func (d *Daemon) trusted(key record.Address) bool { return d.keys().Trusted(key) }

// Trust trusts a host key under name: bundles whose attestations it signed
// may be imported.
func (d *Daemon) Trust(key, name string) (api.TrustedKey, error) {
	k, err := d.keys().Add(key, name)
	if err != nil {
		return api.TrustedKey{}, err
	}
	return apiKey(k), nil
}

// Untrust stops trusting a host key. Runs already imported stay.
func (d *Daemon) Untrust(key string) error { return d.keys().Remove(key) }

// TrustedKeys lists the trusted host keys, this host's first.
func (d *Daemon) TrustedKeys() ([]api.TrustedKey, error) {
	keys, err := d.keys().List()
	if err != nil {
		return nil, err
	}
	out := make([]api.TrustedKey, 0, len(keys))
	for _, k := range keys {
		out = append(out, apiKey(k))
	}
	return out, nil
}

func apiKey(k trust.Key) api.TrustedKey {
	return api.TrustedKey{Key: k.Key.String(), Name: k.Name, Self: k.Self}
}

// signersOf is the API form of a record's signers, with their names.
func (d *Daemon) signersOf(ss []attest.Signer) []api.Signer {
	out := make([]api.Signer, 0, len(ss))
	for _, s := range d.keys().Names(ss) {
		out = append(out, api.Signer{Segment: s.Index, Interval: s.Interval, Key: s.Key.String(), Name: s.Name, Trusted: s.Trusted})
	}
	return out
}

// grantsOf returns an imported bundle's grants as a copy for the API
// (Import's answer).
func grantsOf(g unit.Grants) unit.Grants {
	g.ReadOnly = append([]unit.Mount(nil), g.ReadOnly...)
	return g
}
