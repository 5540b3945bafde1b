package unit

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// pinned returns the specs and grant sets whose bytes unit_test.go pins,
// and a few more shapes (empty lists, several mounts).
func pinnedSpecs() []Spec {
	return []Spec{
		{Image: "demo", ImageDigest: digest, Args: []string{"a", "bc"}, Env: []string{"K=v"}, Mode: TranscriptMode},
		{Image: "demo", ImageDigest: digest, Mode: ImageMode},
		{Image: "x", ImageDigest: digest, Args: []string{""}, Env: []string{"A=", "B=c=d"}, Mode: ImageMode},
	}
}

func pinnedGrants() []Grants {
	return []Grants{
		{MilliCPU: 500, MemoryBytes: 64 << 20, Network: Loopback, ReadOnly: []Mount{{"/data", "/in"}}},
		{Network: NoNetwork},
		{MilliCPU: 1, MemoryBytes: 4 << 20, Network: NoNetwork, ReadOnly: []Mount{{"/a", "/x"}, {"/b/c", "/y/z"}}},
		{Network: Loopback, Limits: Limits{Pids: 8}, Secrets: []string{"API_KEY", "token.v2"}},
	}
}

func TestDecodeSpecRoundTrip(t *testing.T) {
	for _, s := range pinnedSpecs() {
		b, err := s.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeSpec(b)
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		if !reflect.DeepEqual(*got, s) {
			t.Fatalf("got %+v, want %+v", *got, s)
		}
		a, _ := s.ID()
		if id, _ := got.ID(); id != a {
			t.Fatal("id changed across a round trip")
		}
	}
}

func TestDecodeGrantsRoundTrip(t *testing.T) {
	for _, g := range pinnedGrants() {
		b, err := g.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeGrants(b)
		if err != nil {
			t.Fatalf("%+v: %v", g, err)
		}
		if !reflect.DeepEqual(*got, g) {
			t.Fatalf("got %+v, want %+v", *got, g)
		}
	}
}

// refused reports whether err is one of the package's refusals.
func refused(err error) bool { return errors.Is(err, ErrMalformed) || errors.Is(err, ErrInvalid) }

func TestDecodeRefuses(t *testing.T) {
	spec, _ := pinnedSpecs()[0].Canonical()
	grants, _ := pinnedGrants()[0].Canonical()
	type canonical interface{ Canonical() ([]byte, error) }
	decoders := map[string]struct {
		good    []byte
		domain  int
		lengths []int // offsets of the 4-byte lengths and counts, per unit_test.go
		decode  func([]byte) (canonical, error)
	}{
		"spec": {spec, len(SpecDomainV1), []int{17, 25, 100, 104, 109, 115, 119},
			func(b []byte) (canonical, error) { return DecodeSpec(b) }},
		"grants": {grants, len(GrantsDomain), []int{32, 36, 45},
			func(b []byte) (canonical, error) { return DecodeGrants(b) }},
	}
	for name, d := range decoders {
		// Every truncation, including to nothing.
		for n := range len(d.good) {
			if _, err := d.decode(d.good[:n]); !refused(err) {
				t.Errorf("%s truncated to %d: %v", name, n, err)
			}
		}
		// Extended.
		for _, tail := range []string{"\x00", "x", "\x00\x00\x00\x00"} {
			if _, err := d.decode(append(bytes.Clone(d.good), tail...)); !errors.Is(err, ErrMalformed) {
				t.Errorf("%s extended by %q: %v", name, tail, err)
			}
		}
		// Every single-byte edit is refused, or (an edit inside a string or
		// integer) decodes to another value whose bytes are the edited ones.
		// Edits in the domain, lengths and counts are always refused.
		length := map[int]bool{}
		for _, o := range d.lengths {
			for j := range 4 {
				length[o+j] = true
			}
		}
		for i := range d.good {
			b := bytes.Clone(d.good)
			b[i] ^= 0x40
			v, err := d.decode(b)
			switch {
			case err != nil && !refused(err):
				t.Errorf("%s with byte %d edited: %v", name, i, err)
			case err != nil:
			case i < d.domain || length[i]:
				t.Errorf("%s with domain, length or count byte %d edited decoded", name, i)
			default:
				if again, _ := v.Canonical(); !bytes.Equal(again, b) {
					t.Errorf("%s with byte %d edited decoded to other bytes %x", name, i, again)
				}
			}
		}
	}
	// The other's domain.
	if _, err := DecodeSpec(grants); !errors.Is(err, ErrMalformed) {
		t.Errorf("grants as spec: %v", err)
	}
	if _, err := DecodeGrants(spec); !errors.Is(err, ErrMalformed) {
		t.Errorf("spec as grants: %v", err)
	}
	// Well-formed bytes of a spec or grant set that cannot run.
	bad := append([]byte(SpecDomainV1), unhex(t, "00000001 78 00000003 616263 00000000 00000000 01")...)
	if _, err := DecodeSpec(bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad digest: %v", err)
	}
	bad = append([]byte(GrantsDomain), unhex(t, "00000000 00000000000003e8 01 00000000")...)
	if _, err := DecodeGrants(bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("tiny memory: %v", err)
	}
	// A count the bytes cannot hold is refused before it is allocated.
	huge := append([]byte(GrantsDomain), unhex(t, "00000000 0000000000000000 01 ffffffff")...)
	if _, err := DecodeGrants(huge); !errors.Is(err, ErrMalformed) {
		t.Errorf("huge count: %v", err)
	}
}

func FuzzDecodeSpec(f *testing.F) {
	for _, s := range pinnedSpecs() {
		b, _ := s.Canonical()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSpec(b)
		if err != nil {
			if !refused(err) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		again, err := s.Canonical()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded %x, re-encoded %x (%v)", b, again, err)
		}
	})
}

func FuzzDecodeGrants(f *testing.F) {
	for _, g := range pinnedGrants() {
		b, _ := g.Canonical()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := DecodeGrants(b)
		if err != nil {
			if !refused(err) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		again, err := g.Canonical()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded %x, re-encoded %x (%v)", b, again, err)
		}
	})
}
