package record

import (
	"encoding/base64"
	"fmt"
	"strings"

	"lukechampine.com/blake3"
	"lukechampine.com/blake3/guts"
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
func Sum(b []byte) Address {
	if len(b) <= guts.ChunkSize || len(b) > simdBytes {
		return Address(blake3.Sum256(b))
	}
	return sumSIMD(b)
}

// simdBytes is the most BLAKE3 compresses in one vectorised call: 16
// chunks of 1 KiB, a store chunk's size.
const simdBytes = guts.MaxSIMD * guts.ChunkSize

// sumSIMD is the address of b, of more than one BLAKE3 chunk and at most
// simdBytes: its chunks compressed side by side in one call, and the
// root over them. blake3.Sum256 takes, for the same input, a Hasher
// copied to the heap, one goroutine per power-of-two run of chunks and a
// padded copy of each run: about 38 KB allocated and ten times the time
// per 16 KiB chunk (BenchmarkSum), which the page server pays on every
// chunk it serves and a park on every chunk it stores.
func sumSIMD(b []byte) Address {
	var buf [simdBytes]byte
	p := &buf
	if len(b) == simdBytes {
		p = (*[simdBytes]byte)(b)
	} else {
		copy(buf[:], b)
	}
	n := guts.CompressBuffer(p, len(b), &guts.IV, 0, 0)
	n.Flags |= guts.FlagRoot
	out := guts.WordsToBytes(guts.CompressNode(n))
	return Address(out[:32])
}

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
