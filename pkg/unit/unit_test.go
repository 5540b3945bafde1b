package unit

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func unhex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSpecPinned(t *testing.T) {
	s := Spec{Image: "demo", ImageDigest: digest, Args: []string{"a", "bc"}, Env: []string{"K=v"}, Mode: TranscriptMode}
	got, err := s.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte(SpecDomainV1)
	want = append(want, unhex(t, "00000004 64656d6f 00000047")...)
	want = append(want, digest...)
	want = append(want, unhex(t, "00000002 00000001 61 00000002 6263 00000001 00000003 4b3d76 02")...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
}

func TestGrantsPinned(t *testing.T) {
	g := Grants{MilliCPU: 500, MemoryBytes: 64 << 20, Network: Loopback, ReadOnly: []Mount{{"/data", "/in"}}}
	got, err := g.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(GrantsDomain), unhex(t, "000001f4 0000000004000000 02 00000001 00000005 2f64617461 00000003 2f696e")...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
}

func TestIDsSeparateFields(t *testing.T) {
	a := Spec{Image: "demo", ImageDigest: digest, Args: []string{"ab", "c"}, Mode: ImageMode}
	b := Spec{Image: "demo", ImageDigest: digest, Args: []string{"a", "bc"}, Mode: ImageMode}
	c := Spec{Image: "demo", ImageDigest: digest, Args: []string{"a"}, Env: []string{"b=c"}, Mode: ImageMode}
	ia, _ := a.ID()
	ib, _ := b.ID()
	ic, _ := c.ID()
	if ia == ib || ib == ic || ia == ic {
		t.Fatal("distinct specs share an id")
	}
	g1 := Grants{Network: NoNetwork}
	g2 := Grants{Network: Loopback}
	x, _ := g1.ID()
	y, _ := g2.ID()
	if x == y {
		t.Fatal("network not bound")
	}
}

func TestInvalid(t *testing.T) {
	for name, s := range map[string]Spec{
		"no image":   {ImageDigest: digest, Mode: ImageMode},
		"bad digest": {Image: "x", ImageDigest: "sha256:12", Mode: ImageMode},
		"no mode":    {Image: "x", ImageDigest: digest},
		"bad env":    {Image: "x", ImageDigest: digest, Mode: ImageMode, Env: []string{"novalue"}},
		"nul arg":    {Image: "x", ImageDigest: digest, Mode: ImageMode, Args: []string{"a\x00b"}},
	} {
		if _, err := s.ID(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, g := range map[string]Grants{
		"no network":   {},
		"tiny memory":  {Network: NoNetwork, MemoryBytes: 1000},
		"relative":     {Network: NoNetwork, ReadOnly: []Mount{{"data", "/in"}}},
		"onto root":    {Network: NoNetwork, ReadOnly: []Mount{{"/data", "/"}}},
		"unclean path": {Network: NoNetwork, ReadOnly: []Mount{{"/data", "/in/../etc"}}},
		"unclean src":  {Network: NoNetwork, ReadOnly: []Mount{{"/data/../proc", "/in"}}},
		"host root":    {Network: NoNetwork, ReadOnly: []Mount{{"/", "/host"}}},
		"proc":         {Network: NoNetwork, ReadOnly: []Mount{{"/proc", "/in"}}},
		"proc root":    {Network: NoNetwork, ReadOnly: []Mount{{"/proc/1/root", "/in"}}},
		"sys":          {Network: NoNetwork, ReadOnly: []Mount{{"/sys/fs", "/in"}}},
		"dev":          {Network: NoNetwork, ReadOnly: []Mount{{"/dev", "/in"}}},
		"run":          {Network: NoNetwork, ReadOnly: []Mount{{"/run/containerd", "/in"}}},
	} {
		if _, err := g.ID(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestGrantsLimitsBlock(t *testing.T) {
	plain := Grants{Network: Loopback}
	pb, err := plain.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	limited := plain
	limited.Limits = Limits{Pids: 7, SnapshotBytes: 1 << 40}
	lb, err := limited.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, pb...), 0x01, 0, 0, 0, 7)
	want = append(want, make([]byte, 8+8+4+8+4+8)...)
	want = append(want, 0, 0, 1, 0, 0, 0, 0, 0)
	if !bytes.Equal(lb, want) {
		t.Fatalf("limits block:\n got %x\nwant %x", lb, want)
	}
	g, err := DecodeGrants(lb)
	if err != nil || g.Limits != limited.Limits {
		t.Fatalf("decode: %+v, %v", g, err)
	}
	// A block of zeros is not what Canonical writes.
	zeros := append(append([]byte{}, pb...), 0x01)
	zeros = append(zeros, make([]byte, 52)...)
	if _, err := DecodeGrants(zeros); !errors.Is(err, ErrMalformed) {
		t.Fatalf("all-zero limits block: %v, want ErrMalformed", err)
	}
	if _, err := DecodeGrants(append(append([]byte{}, pb...), 0x02)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad tag: %v, want ErrMalformed", err)
	}
	if got := (Limits{Pids: 3}).Or(DefaultLimits); got.Pids != 3 || got.LogBytes != DefaultLimits.LogBytes {
		t.Fatalf("Or: %+v", got)
	}
}

func TestSpecNonce(t *testing.T) {
	s := Spec{Image: "demo", ImageDigest: digest, Args: []string{"a"}, Mode: ImageMode, Nonce: "00112233445566778899aabbccddeeff"}
	got, err := s.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("runrecordd.unit/2")
	want = append(want, unhex(t, "00000004 64656d6f 00000047")...)
	want = append(want, digest...)
	want = append(want, unhex(t, "00000001 00000001 61 00000000 01 00000020")...)
	want = append(want, s.Nonce...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	back, err := DecodeSpec(got)
	if err != nil || back.Nonce != s.Nonce {
		t.Fatalf("decode: %+v, %v", back, err)
	}
	// Two specs that differ only in their nonce are two units.
	other := s
	if other.Nonce, err = NewNonce(); err != nil {
		t.Fatal(err)
	}
	a, _ := s.ID()
	b, _ := other.ID()
	if a == b {
		t.Fatal("specs with different nonces have one unit_id")
	}
	for _, bad := range []string{"00112233", "00112233445566778899AABBCCDDEEFF", "00112233445566778899aabbccddeefg"} {
		s.Nonce = bad
		if err := s.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("nonce %q: %v, want ErrInvalid", bad, err)
		}
	}
	// A unit/2 spec must carry a nonce.
	empty := []byte("runrecordd.unit/2")
	empty = append(empty, unhex(t, "00000004 64656d6f 00000047")...)
	empty = append(empty, digest...)
	empty = append(empty, unhex(t, "00000000 00000000 01 00000000")...)
	if _, err := DecodeSpec(empty); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unit/2 without a nonce: %v, want ErrMalformed", err)
	}
}
