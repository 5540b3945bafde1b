// Package trust is the daemon's room for the host keys this host trusts:
// the set kept in the store (`runrecordd trust add|remove|list`), plus
// this host's own key, always trusted and never stored. A bundle whose
// attestations a key in the set signed may be imported (docs/trust.md).
//
// Its types are its own, not the API's: the daemon converts them at its
// edge.
package trust

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// SelfName is the name this host's own key goes by.
const SelfName = "this host"

// ErrKey is a key request that cannot be carried out: a key id that does
// not parse, or the removal of this host's own key. Its text is the
// daemon's ErrInvalid's, so a refusal reads as it always has.
var ErrKey = errors.New("invalid request")

// Store is what the set reads and writes (*store.Store).
type Store interface {
	Trust(key record.Address, name string) error
	Untrust(key record.Address) error
	TrustedKeys() ([]store.TrustedKey, error)
	IsTrusted(key record.Address) bool
}

// Keys is the host's trusted-key set over its store. It holds no state of
// its own: a value is made once and never stale.
type Keys struct {
	Store Store
	Self  record.Address // this host's key id
	Log   *slog.Logger   // slog.Default() when nil
	// Admitted, when not nil, says whether a key is admitted to the
	// host's fleet as a host (docs/fleet.md): such a key is trusted too,
	// though not in the set.
	Admitted func(record.Address) bool
}

// Key is a trusted key and its name; Self marks this host's own.
type Key struct {
	Key  record.Address
	Name string
	Self bool
}

// Signer is a record's signer (pkg/attest) with the name its key is
// trusted under: empty for a key not in the set.
type Signer struct {
	attest.Signer
	Name string
}

// Trusted says whether key is trusted here: this host's own key, one in
// the set, or one admitted to the host's fleet as a host.
func (k Keys) Trusted(key record.Address) bool {
	return key == k.Self || k.Store.IsTrusted(key) || (k.Admitted != nil && k.Admitted(key))
}

// Add trusts the key whose id is key (its address text, b3:… or without
// the prefix) under name. This host's own key is answered as Self and not
// stored: it is always trusted.
func (k Keys) Add(key, name string) (Key, error) {
	a, err := ParseKey(key)
	if err != nil {
		return Key{}, err
	}
	if a == k.Self {
		return k.self(), nil
	}
	if err := k.Store.Trust(a, name); err != nil {
		return Key{}, err
	}
	k.log().Info("host key trusted", "key", a, "name", name)
	return Key{Key: a, Name: name}, nil
}

// Remove stops trusting key. Runs already imported stay. This host's own
// key cannot be removed.
func (k Keys) Remove(key string) error {
	a, err := ParseKey(key)
	if err != nil {
		return err
	}
	if a == k.Self {
		return fmt.Errorf("%w: this host's own key is always trusted", ErrKey)
	}
	if err := k.Store.Untrust(a); err != nil {
		return err
	}
	k.log().Info("host key no longer trusted", "key", a)
	return nil
}

// List is the trusted keys: this host's first, then the set's, ordered by
// key id.
func (k Keys) List() ([]Key, error) {
	keys, err := k.Store.TrustedKeys()
	if err != nil {
		return nil, err
	}
	out := []Key{k.self()}
	for _, t := range keys {
		out = append(out, Key{Key: t.Key, Name: t.Name})
	}
	return out, nil
}

// Names is signers with the names their keys are trusted under. A set the
// store cannot read names only this host: the names are a courtesy, and
// whether each signer is trusted was judged when the record was read.
func (k Keys) Names(signers []attest.Signer) []Signer {
	names := map[record.Address]string{k.Self: SelfName}
	if keys, err := k.Store.TrustedKeys(); err == nil {
		for _, t := range keys {
			names[t.Key] = t.Name
		}
	}
	out := make([]Signer, 0, len(signers))
	for _, s := range signers {
		out = append(out, Signer{Signer: s, Name: names[s.Key]})
	}
	return out
}

func (k Keys) self() Key { return Key{Key: k.Self, Name: SelfName, Self: true} }

func (k Keys) log() *slog.Logger {
	if k.Log == nil {
		return slog.Default()
	}
	return k.Log
}

// ParseKey reads a host key id: its address text (b3:…), as `runrecordd
// host` and a refusal print it, with or without the prefix; a malformed one
// is ErrKey. Every place a person names a host key reads it here.
func ParseKey(s string) (record.Address, error) {
	if !strings.HasPrefix(s, record.AddressPrefix) {
		s = record.AddressPrefix + s
	}
	a, err := record.ParseAddress(s)
	if err != nil {
		return record.Address{}, fmt.Errorf("%w: host key %q: %w", ErrKey, s, err)
	}
	return a, nil
}
