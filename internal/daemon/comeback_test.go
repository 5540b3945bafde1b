package daemon

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A run this host started with a read-only mount (its own operator's
// grant) and handed off comes back with --reclaim: the genesis binds the
// grants, and this host granted them, so the bundle mount policy (empty
// by default) is not applied to them again.
func TestOwnRunWithAMountComesBack(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = &runTable{st: h.d.st}
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))
	h.d.keyID = attest.KeyID(key.Public().(ed25519.PublicKey))
	h.d.cfg.StateDir = t.TempDir()
	h.d.wire()
	data := t.TempDir()
	r := bundletest.Run{Spec: unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{"a"}},
		Grants: unit.Grants{Network: unit.NoNetwork, ReadOnly: []unit.Mount{{Source: data, Target: "/data"}}}, Key: key, Transcript: []byte("{\"t\":1}\n"),
		Calls: []protocol.Call{{ID: "c1", Kind: "http", Payload: []byte(`{}`)}}}
	b, err := r.Forge("r")
	if err != nil {
		t.Fatal(err)
	}
	// Stored as if this host had run it (local runs are not judged by the bundle policy).
	sb, err := bundle.Stage(t.Context(), h.d.st, bytes.NewReader(b.Tar(nil)), bundle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Adopt(t.Context(), h.d.st); err != nil {
		t.Fatal(err)
	}
	if err := h.d.st.ImportAs("r", sb.Record, false); err != nil {
		t.Fatal(err)
	}
	sb.Close()
	if err := h.d.st.HandOff("r", sb.Record.Head()); err != nil {
		t.Fatal(err)
	}
	_, err = h.d.ImportWith(t.Context(), bytes.NewReader(b.Tar(nil)), "r", true)
	if err != nil {
		t.Fatalf("import --reclaim of this host's own handed-off run: %v", err)
	}
	if _, off, _ := h.d.st.HandedOff("r"); off {
		t.Fatal("still handed off after the reclaim")
	}
	// Another host, holding nothing of it, applies its policy.
	g := mustMetricsHost(t, "")
	g.d.runs = &runTable{st: g.d.st}
	g.d.cfg.StateDir = t.TempDir()
	g.d.keyID = h.d.keyID
	g.d.wire()
	if _, err := g.d.ImportWith(t.Context(), bytes.NewReader(b.Tar(nil)), "r", false); !errors.Is(err, bundle.ErrPolicy) {
		t.Fatalf("a host that never granted the mount: %v, want the policy's refusal", err)
	}
}
