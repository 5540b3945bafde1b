package daemon

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// trusted says whether a host key id is trusted here: this daemon's own
// key, or one trusted with `runrecordd trust add`.
func (d *Daemon) trusted(key record.Address) bool {
	return key == d.keyID || d.st.IsTrusted(key)
}

// parseKey reads a host key id: its address text (b3:…), as `runrecordd
// host` and a refusal print it.
func parseKey(s string) (record.Address, error) {
	if !strings.HasPrefix(s, record.AddressPrefix) {
		s = record.AddressPrefix + s
	}
	k, err := record.ParseAddress(s)
	if err != nil {
		return record.Address{}, fmt.Errorf("%w: host key %q: %w", ErrInvalid, s, err)
	}
	return k, nil
}

// Trust trusts a host key under name: bundles whose attestations it signed
// may be imported.
func (d *Daemon) Trust(key, name string) (api.TrustedKey, error) {
	k, err := parseKey(key)
	if err != nil {
		return api.TrustedKey{}, err
	}
	if k == d.keyID {
		return api.TrustedKey{Key: k.String(), Name: "this host", Self: true}, nil
	}
	if err := d.st.Trust(k, name); err != nil {
		return api.TrustedKey{}, err
	}
	d.log.Info("host key trusted", "key", k, "name", name)
	return api.TrustedKey{Key: k.String(), Name: name}, nil
}

// Untrust stops trusting a host key. Runs already imported stay.
func (d *Daemon) Untrust(key string) error {
	k, err := parseKey(key)
	if err != nil {
		return err
	}
	if k == d.keyID {
		return fmt.Errorf("%w: this host's own key is always trusted", ErrInvalid)
	}
	if err := d.st.Untrust(k); err != nil {
		return err
	}
	d.log.Info("host key no longer trusted", "key", k)
	return nil
}

// TrustedKeys lists the trusted host keys, this host's first.
func (d *Daemon) TrustedKeys() ([]api.TrustedKey, error) {
	keys, err := d.st.TrustedKeys()
	if err != nil {
		return nil, err
	}
	out := []api.TrustedKey{{Key: d.keyID.String(), Name: "this host", Self: true}}
	for _, k := range keys {
		out = append(out, api.TrustedKey{Key: k.Key.String(), Name: k.Name})
	}
	return out, nil
}

// signersOf is a record's signers, with their names.
func (d *Daemon) signersOf(ss []attest.Signer) []Signer {
	names := map[record.Address]string{d.keyID: "this host"}
	if keys, err := d.st.TrustedKeys(); err == nil {
		for _, k := range keys {
			names[k.Key] = k.Name
		}
	}
	out := make([]Signer, 0, len(ss))
	for _, s := range ss {
		out = append(out, Signer{Signer: s, Name: names[s.Key]})
	}
	return out
}

// bundlePolicy is this host's policy for the grants a bundle asks for.
func (d *Daemon) bundlePolicy() *bundle.Policy {
	p := &bundle.Policy{AllowMounts: d.cfg.BundleMounts, StateDir: d.cfg.StateDir, MaxLimits: bundle.DefaultMaxLimits,
		MaxMilliCPU: uint32(runtime.NumCPU()) * 1000}
	if mem, err := hostMemory(); err == nil {
		p.MaxMemoryBytes = mem
	}
	return p
}

// grantsOf returns g as a copy for the API.
func grantsOf(g unit.Grants) unit.Grants {
	g.ReadOnly = append([]unit.Mount(nil), g.ReadOnly...)
	return g
}

// hostMemory is the host's RAM, from /proc/meminfo.
func hostMemory() (uint64, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, err
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return 0, err
	}
	if mi.MemTotalBytes == nil || *mi.MemTotalBytes == 0 {
		return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
	}
	return *mi.MemTotalBytes, nil
}
