package record

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// fill returns the address whose 32 bytes are all b.
func fill(b byte) Address {
	var a Address
	copy(a[:], bytes.Repeat([]byte{b}, 32))
	return a
}

func ptr(a Address) *Address { return &a }

// hx decodes hex written out by hand; spaces and newlines are ignored, and
// "AA*32" stands for 32 bytes of 0xAA.
func hx(t testing.TB, s string) []byte {
	t.Helper()
	var out []byte
	for _, f := range strings.Fields(s) {
		if i := strings.Index(f, "*"); i > 0 {
			b, err := hex.DecodeString(f[:i])
			if err != nil || len(b) != 1 {
				t.Fatalf("bad repeat %q", f)
			}
			n := 0
			for _, c := range f[i+1:] {
				n = n*10 + int(c-'0')
			}
			out = append(out, bytes.Repeat(b, n)...)
			continue
		}
		b, err := hex.DecodeString(f)
		if err != nil {
			t.Fatalf("bad hex %q: %v", f, err)
		}
		out = append(out, b...)
	}
	return out
}

// mustRecord returns an empty record whose every state is verified from
// genesis when the test ends, as a store's cleanup check would.
func mustRecord(t *testing.T) *Record {
	t.Helper()
	r := New(fill(0x01), fill(0x02))
	t.Cleanup(func() {
		if err := r.Verify(); err != nil {
			t.Errorf("cleanup: record does not verify from genesis: %v", err)
		}
		back, err := DecodeWire(r.EncodeWire())
		if err != nil {
			t.Errorf("cleanup: wire form does not decode: %v", err)
		} else if back.Head() != r.Head() {
			t.Errorf("cleanup: wire form head %s, record head %s", back.Head(), r.Head())
		}
	})
	return r
}

func mustAppend(t *testing.T, r *Record, s Segment) Address {
	t.Helper()
	h, err := r.Append(s)
	if err != nil {
		t.Fatalf("append %s: %v", s.Kind, err)
	}
	return h
}

func hexOf(b []byte) string {
	return hex.EncodeToString(b)
}

func (a Address) bytes() []byte { return a[:] }
