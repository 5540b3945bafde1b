package interval

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Signer signs a host's attestations and keeps its audit chain: each
// attestation names the one signed before it (audit_prev), and the last is
// kept in a file so a restarted daemon continues the chain.
type Signer struct {
	key  ed25519.PrivateKey
	path string // the audit head's file

	mu   sync.Mutex
	head *record.Address // the last attestation signed; nil before the first
}

// NewSigner returns a signer with key whose audit head is kept at path,
// reading the head an earlier process left there.
func NewSigner(key ed25519.PrivateKey, path string) (*Signer, error) {
	s := &Signer{key: key, path: path}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("audit head: %w", err)
	}
	a, err := record.ParseAddress(string(b))
	if err != nil {
		return nil, fmt.Errorf("audit head %s: %w", path, err)
	}
	s.head = &a
	return s, nil
}

// Head is the host's last attestation, nil before the first.
func (s *Signer) Head() *record.Address {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == nil {
		return nil
	}
	h := *s.head
	return &h
}

// KeyID is BLAKE3 of the signer's public key.
func (s *Signer) KeyID() record.Address { return attest.KeyID(s.key.Public().(ed25519.PublicKey)) }

// seal signs body with the audit head as its audit_prev, stores the
// envelope (referring to the receipt and journal), keeps it as a root and
// advances the head, durably. One lock covers it all: two intervals
// sealed at once never share an audit_prev.
func (s *Signer) seal(st Store, body *attest.Body) (record.Address, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body.AuditPrev = s.head
	signed, err := attest.Sign(body, s.key)
	if err != nil {
		return record.Address{}, err
	}
	att, err := st.PutBytes(signed.Encode(), body.Receipt, body.Journal)
	if err != nil {
		return record.Address{}, err
	}
	// The next attestation names this one: it is kept whether or not a
	// segment ever names it.
	if err := st.AddRoot(att); err != nil {
		return record.Address{}, err
	}
	if err := replaceFile(s.path, []byte(att.String()), true); err != nil {
		return record.Address{}, fmt.Errorf("audit head: %w", err)
	}
	s.head = &att
	return att, nil
}
