package daemon

import (
	"bytes"
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/bundle"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// importHost is a daemon whose own key signed the forged runs of forgeRun.
func importHost(t *testing.T) metricsHost {
	t.Helper()
	h := mustMetricsHost(t, "")
	h.d.runs = map[string]*run{}
	h.d.cfg.StateDir = t.TempDir()
	h.d.keyID = attest.KeyID(ownKey.Public().(ed25519.PublicKey))
	return h
}

var ownKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))

func forgeRun(t *testing.T, edit func(*bundletest.Run)) *bundletest.Bundle {
	t.Helper()
	r := bundletest.Run{Spec: unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{"a"}},
		Grants: unit.Grants{Network: unit.NoNetwork}, Key: ownKey, Transcript: []byte("{\"t\":1}\n"),
		Calls: []protocol.Call{{ID: "c1", Kind: "http", Payload: []byte(`{}`)}}}
	if edit != nil {
		edit(&r)
	}
	b, err := r.Forge("r")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The daemon answers an import as it did before import moved to
// pkg/bundle: the run's summary, its grants and named signers; and each
// refusal under the same API code.
func TestImportAnswers(t *testing.T) {
	h := importHost(t)
	b := forgeRun(t, nil)
	im, err := h.d.ImportWith(t.Context(), bytes.NewReader(b.Tar(nil)), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if im.Run.ID != "r" || im.Run.Status != "parked (transcript)" || im.Run.Head != b.Record.Head().String() || im.Objects != len(b.Objects) ||
		len(im.Signers) != 1 || im.Signers[0].Name != "this host" || !im.Signers[0].Trusted || im.Grants.Network != unit.NoNetwork {
		t.Fatalf("%+v", im)
	}
	ext, err := b.Extend(ownKey, []byte("{\"t\":2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	other := func(edit func(*bundletest.Run)) []byte { return forgeRun(t, edit).Tar(nil) }
	for name, c := range map[string]struct {
		raw  []byte
		id   string
		code string
	}{
		"untrusted signer":   {raw: other(func(r *bundletest.Run) { r.Key = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, 32)) }), id: "u", code: api.CodeUntrustedSigner},
		"out of place":       {raw: other(func(r *bundletest.Run) { r.Legacy, r.Spec.Args = true, []string{"p"} }), code: api.CodeRecordInvalid},
		"grant refused":      {raw: other(func(r *bundletest.Run) { r.Grants.ReadOnly = []unit.Mount{{Source: "/etc", Target: "/m"}} }), code: api.CodeGrantRefused},
		"not a bundle":       {raw: []byte("nothing"), code: api.CodeBadRequest},
		"a bad id":           {raw: b.Tar(nil), id: "x_t1", code: api.CodeBadRequest},
		"a bad id inside":    {raw: b.Tar(func(h *bundle.Header) { h.Run = "../r" }), code: api.CodeBadRequest},
		"held here":          {raw: b.Tar(nil), code: api.CodeExists},
		"held here, again":   {raw: b.Tar(nil), id: "again", code: api.CodeGenesisHeld},
		"not handed off":     {raw: ext.Tar(nil), code: api.CodeExists},
		"missing object":     {raw: withoutObject(forgeRun(t, func(r *bundletest.Run) { r.Spec.Args = []string{"m"} }), 1), code: api.CodeMissingObject},
		"over a limit":       {raw: b.Tar(func(h *bundle.Header) { h.Bytes = 1 << 40 }), code: api.CodeBundleLimit},
		"closed, not parked": {raw: closed(t, forgeRun(t, nil)), code: api.CodeBadRequest},
	} {
		_, err := h.d.ImportWith(t.Context(), bytes.NewReader(c.raw), c.id, false)
		if err == nil || ErrorOf(err).Code != c.code {
			t.Errorf("%s: %v, want %s", name, err, c.code)
		}
	}
	if err := h.d.st.HandOff("r", b.Record.Head()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.ImportWith(t.Context(), bytes.NewReader(b.Tar(nil)), "", false); err == nil || ErrorOf(err).Code != api.CodeGenesisHeld {
		t.Fatalf("the bundle handed off, again: %v", err)
	}
	if im, err = h.d.ImportWith(t.Context(), bytes.NewReader(ext.Tar(nil)), "", false); err != nil || im.Run.Segments != 5 || im.Run.HandedOff {
		t.Fatalf("taken back one interval on: %+v, %v", im, err)
	}
}

func withoutObject(b *bundletest.Bundle, seg int) []byte {
	b.Drop(*b.Record.Segment(seg).Snapshot.Transcript)
	return b.Tar(nil)
}

func closed(t *testing.T, b *bundletest.Bundle) []byte {
	if _, err := b.Record.Append(record.Closure("done")); err != nil {
		t.Fatal(err)
	}
	return b.Tar(nil)
}
