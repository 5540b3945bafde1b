// Package unit is what a run executes: a [Spec] (image, arguments,
// environment, mode) and the [Grants] it runs under (CPU and memory
// limits, network, read-only mounts). A run's unit_id and grants_id are the
// addresses of their canonical bytes, and the genesis head binds both, so a
// run continued with other grants is a new run.
//
// Canonical bytes: a domain string, then every field in order; integers are
// big-endian, strings and lists carry a 4-byte length or count in front.
// docs/unit.md gives the layouts. [DecodeSpec] and [DecodeGrants] accept
// only those bytes.
package unit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Domains. A spec with a nonce is written under SpecDomain; one without,
// under SpecDomainV1 (records made before runs had nonces still decode and
// verify; the daemon makes no new one).
const (
	SpecDomain   = "runrecordd.unit/2"
	SpecDomainV1 = "runrecordd.unit/1"
	GrantsDomain = "runrecordd.grants/1"
)

// NonceLen is the length of a spec's nonce: 32 lowercase hex digits
// (16 random bytes).
const NonceLen = 32

// Errors returned by this package; test with errors.Is.
var (
	// ErrInvalid: a spec or grant set that cannot run.
	ErrInvalid = errors.New("invalid unit")
	// ErrMalformed: bytes that are not the canonical bytes of a spec or
	// grant set: another domain, a bad length, trailing bytes, or a
	// decoding that does not re-encode to the same bytes.
	ErrMalformed = errors.New("malformed unit bytes")
	// ErrSource: a mount source no grant may name (with ErrInvalid).
	ErrSource = errors.New("mount source never granted")
)

// Mode is how a unit parks.
type Mode uint8

// Modes.
const (
	ImageMode      Mode = 1 // parks by CRIU checkpoint
	TranscriptMode Mode = 2 // parks by its transcript
)

func (m Mode) String() string {
	switch m {
	case ImageMode:
		return "image"
	case TranscriptMode:
		return "transcript"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses "image" or "transcript".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "image", "":
		return ImageMode, nil
	case "transcript":
		return TranscriptMode, nil
	}
	return 0, fmt.Errorf("%w: mode %q: want image or transcript", ErrInvalid, s)
}

// MarshalText writes the mode's name ("" for the zero mode, which a request
// leaves to the daemon's default).
func (m Mode) MarshalText() ([]byte, error) {
	if m == 0 {
		return nil, nil
	}
	return []byte(m.String()), nil
}

// UnmarshalText reads a mode's name; "" is the zero mode.
func (m *Mode) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = 0
		return nil
	}
	v, err := ParseMode(string(b))
	*m = v
	return err
}

// Spec is a unit: an image by name and content digest, what to run in it,
// and how it parks.
type Spec struct {
	Image       string   `json:"image"`        // image name, as imported
	ImageDigest string   `json:"image_digest"` // the image's manifest digest, "sha256:…"
	Args        []string `json:"args"`         // argv; empty runs the image's entrypoint
	Env         []string `json:"env"`          // KEY=VALUE, in order
	Mode        Mode     `json:"mode"`
	// Nonce makes the spec, and so the run's genesis, unique to one run:
	// the daemon draws it (16 random bytes, hex) when the run starts, and
	// a request may not choose it. Empty only in specs of records made
	// before runs had nonces.
	Nonce string `json:"nonce,omitempty"`
}

// NewNonce draws a fresh nonce.
func NewNonce() (string, error) {
	var b [NonceLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// Validate reports whether s can run.
func (s *Spec) Validate() error {
	if s.Image == "" {
		return fmt.Errorf("%w: no image", ErrInvalid)
	}
	if !strings.HasPrefix(s.ImageDigest, "sha256:") || len(s.ImageDigest) != 71 {
		return fmt.Errorf("%w: image digest %q is not sha256:<64 hex>", ErrInvalid, s.ImageDigest)
	}
	if s.Mode != ImageMode && s.Mode != TranscriptMode {
		return fmt.Errorf("%w: %s", ErrInvalid, s.Mode)
	}
	if s.Nonce != "" {
		if len(s.Nonce) != NonceLen || strings.Trim(s.Nonce, "0123456789abcdef") != "" {
			return fmt.Errorf("%w: nonce %q is not %d lowercase hex digits", ErrInvalid, s.Nonce, NonceLen)
		}
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrInvalid, e)
		}
	}
	for _, str := range append(append([]string{s.Image, s.ImageDigest}, s.Args...), s.Env...) {
		if !utf8.ValidString(str) || strings.ContainsRune(str, 0) {
			return fmt.Errorf("%w: %q is not text", ErrInvalid, str)
		}
	}
	return nil
}
