package record

import (
	"encoding/base64"
	"fmt"
	"strings"

	"lukechampine.com/blake3"
)

// AddressPrefix starts the text form of every [Address].
const AddressPrefix = "b3:"

// addressTextLen is the length of an address's text form: the prefix and
// 43 characters of unpadded base64url.
const addressTextLen = len(AddressPrefix) + 43

// b64 is strict: it refuses padding and non-zero trailing bits, so every
// address has exactly one text form.
var b64 = base64.RawURLEncoding.Strict()

// Address is the 32-byte BLAKE3 digest of an object's bytes.
type Address [32]byte

// Sum returns the address of b.
func Sum(b []byte) Address { return Address(blake3.Sum256(b)) }

// IsZero reports whether a is the all-zero address, which no object has in
// practice and which this package treats as "not set".
func (a Address) IsZero() bool { return a == Address{} }

// String returns the text form: "b3:" followed by 43 characters of
// unpadded base64url.
func (a Address) String() string {
	var buf [addressTextLen]byte
	copy(buf[:], AddressPrefix)
	b64.Encode(buf[len(AddressPrefix):], a[:])
	return string(buf[:])
}

// ParseAddress parses the text form written by [Address.String]. A wrong
// prefix, length, alphabet or padding is an error wrapping [ErrAddress].
func ParseAddress(s string) (Address, error) {
	var a Address
	if !strings.HasPrefix(s, AddressPrefix) {
		return a, fmt.Errorf("%w: %q: missing %q prefix", ErrAddress, s, AddressPrefix)
	}
	if len(s) != addressTextLen {
		return a, fmt.Errorf("%w: %q: %d characters, want %d", ErrAddress, s, len(s), addressTextLen)
	}
	n, err := b64.Decode(a[:], []byte(s[len(AddressPrefix):]))
	if err != nil || n != len(a) {
		return Address{}, fmt.Errorf("%w: %q: not unpadded base64url", ErrAddress, s)
	}
	return a, nil
}

// MarshalText implements encoding.TextMarshaler.
func (a Address) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with [ParseAddress].
func (a *Address) UnmarshalText(b []byte) error {
	p, err := ParseAddress(string(b))
	if err != nil {
		return err
	}
	*a = p
	return nil
}
