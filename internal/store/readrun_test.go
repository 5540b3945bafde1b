package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ReadRun decodes what a run's genesis binds, and refuses bytes that are
// not a unit spec or a grant set.
func TestReadRun(t *testing.T) {
	s := mustStore(t)
	spec := unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("ab", 32), Args: []string{"/unit"}, Nonce: strings.Repeat("0f", 16), Mode: unit.ImageMode}
	grants := unit.Grants{MilliCPU: 500, MemoryBytes: 64 << 20, Network: unit.NoNetwork}
	sb, err := spec.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	gb, err := grants.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	ua, ga := put(t, s, string(sb)), put(t, s, string(gb))
	if _, err := s.Create("good", ua, ga); err != nil {
		t.Fatal(err)
	}
	r, err := s.Run("good")
	if err != nil {
		t.Fatal(err)
	}
	gotSpec, gotGrants, err := s.ReadRun(r)
	if err != nil {
		t.Fatal(err)
	}
	if gotSpec.Image != spec.Image || gotSpec.Nonce != spec.Nonce || gotGrants.MilliCPU != 500 || gotGrants.MemoryBytes != 64<<20 {
		t.Errorf("read %+v %+v, want %+v %+v", gotSpec, gotGrants, spec, grants)
	}

	junk := put(t, s, "not a unit spec")
	for _, c := range []struct {
		name         string
		unit, grants record.Address
	}{{"spec", junk, ga}, {"grants", ua, junk}} {
		if _, err := s.Create("bad-"+c.name, c.unit, c.grants); err != nil {
			t.Fatal(err)
		}
		r, err := s.Run("bad-" + c.name)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.ReadRun(r); err == nil {
			t.Errorf("a run whose %s is junk read without error", c.name)
		}
	}
	r.Unit = record.Sum([]byte("absent"))
	if _, _, err := s.ReadRun(r); !errors.Is(err, ErrMissingObject) {
		t.Errorf("absent unit spec: %v, want ErrMissingObject", err)
	}
}
