//go:build linux

package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The attack suite: a hostile unit (units/hostile) and hostile bundles, one
// test per finding of docs/trust.md. Every test checks that the host is
// untouched, the record unchanged, and the daemon still serving.

// hostileImage is the name the hostile unit's image is imported under.
const hostileImage = "runrecordd.test/hostile:1"

// hostileArchive and hostileDigest: the hostile unit's OCI archive and its
// manifest digest, built by trBuildUnits.
var hostileArchive, hostileDigest string

// Finding 11: two runs of one unit (same image, arguments, environment and
// grants) must not share a genesis, or their records could be exchanged.
// The daemon draws a nonce into each run's unit; a request cannot choose
// one.
func TestAttackTwoRunsTwoGeneses(t *testing.T) {
	privileged(t)
	d := trShared(t)
	ctx := context.Background()
	geneses := map[record.Address]string{}
	for _, id := range []string{"genesis-a", "genesis-b"} {
		trStart(t, d, id, trAgentImage, "STEPS=1")
		s, err := d.c.Show(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Unit == nil || s.Grants == nil || len(s.Unit.Nonce) != unit.NonceLen {
			t.Fatalf("run %s: unit %+v: want a %d-digit nonce", id, s.Unit, unit.NonceLen)
		}
		u, err := s.Unit.ID()
		if err != nil {
			t.Fatal(err)
		}
		g, err := s.Grants.ID()
		if err != nil {
			t.Fatal(err)
		}
		h := record.Genesis(u, g)
		if other, ok := geneses[h]; ok {
			t.Fatalf("runs %s and %s share the genesis %s", other, id, h)
		}
		geneses[h] = id
	}
	// A request that names its own nonce is refused, and starts nothing.
	_, err := d.c.Start(ctx, api.RunRequest{ID: "genesis-chosen",
		Unit:   unit.Spec{Image: trAgentImage, Env: []string{"STEPS=1"}, Mode: unit.TranscriptMode, Nonce: "00112233445566778899aabbccddeeff"},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 128 << 20, Network: unit.NoNetwork}})
	if err == nil || !strings.Contains(err.Error(), "nonce") {
		t.Fatalf("a run with a chosen nonce: %v, want a refusal naming the nonce", err)
	}
	if _, err := d.run(ctx, "genesis-chosen"); err == nil {
		t.Fatal("the refused run exists")
	}
}
