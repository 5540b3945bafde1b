package daemon

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// importHost is a daemon whose own key signed the forged runs of forgeRun.
func importHost(t *testing.T) metricsHost {
	t.Helper()
	h := mustMetricsHost(t, "")
	h.d.runs = &runTable{st: h.d.st}
	h.d.cfg.StateDir = t.TempDir()
	h.d.keyID = attest.KeyID(ownKey.Public().(ed25519.PublicKey))
	h.d.wire()
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
// internal/bundle: the run's summary, its grants and named signers; and each
// refusal under the same API code.
func TestImportAnswers(t *testing.T) {
	h := importHost(t)
	b := forgeRun(t, nil)
	im, err := h.d.ImportWith(t.Context(), bytes.NewReader(b.Tar(nil)), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if im.Run.ID != "r" || im.Run.Status != answers.ParkedTranscript || im.Run.Head != b.Record.Head() || im.Objects != len(b.Objects) ||
		len(im.Signers) != 1 || im.Signers[0].Name != "this host" || !im.Signers[0].Trusted || im.Grants.Network != unit.NoNetwork {
		t.Fatalf("%+v", im)
	}
	ext, err := b.Extend(ownKey, []byte("{\"t\":2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	other := func(edit func(*bundletest.Run)) []byte { return forgeRun(t, edit).Tar(nil) }
	for name, c := range map[string]struct {
		raw []byte
		id  string
		is  func(error) bool
	}{
		"untrusted signer":   {raw: other(func(r *bundletest.Run) { r.Key = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, 32)) }), id: "u", is: as[*attest.UntrustedError]},
		"out of place":       {raw: other(func(r *bundletest.Run) { r.Legacy, r.Spec.Args = true, []string{"p"} }), is: as[*attest.PlaceError]},
		"grant refused":      {raw: other(func(r *bundletest.Run) { r.Grants.ReadOnly = []unit.Mount{{Source: "/etc", Target: "/m"}} }), is: is(bundle.ErrPolicy)},
		"not a bundle":       {raw: []byte("nothing"), is: is(bundle.ErrMalformed)},
		"a bad id":           {raw: b.Tar(nil), id: "x_t1", is: is(store.ErrRunID)},
		"a bad id inside":    {raw: b.Tar(func(h *bundle.Header) { h.Run = "../r" }), is: is(store.ErrRunID)},
		"held here":          {raw: b.Tar(nil), is: is(store.ErrRunExists)},
		"held here, again":   {raw: b.Tar(nil), id: "again", is: is(store.ErrGenesisHeld)},
		"not handed off":     {raw: ext.Tar(nil), is: is(store.ErrRunExists)},
		"missing object":     {raw: withoutObject(forgeRun(t, func(r *bundletest.Run) { r.Spec.Args = []string{"m"} }), 1), is: is(store.ErrMissingObject)},
		"over a limit":       {raw: b.Tar(func(h *bundle.Header) { h.Bytes = 1 << 40 }), is: is(bundle.ErrLimit)},
		"closed, not parked": {raw: closed(t, forgeRun(t, nil)), is: is(bundle.ErrMalformed)},
	} {
		_, err := h.d.ImportWith(t.Context(), bytes.NewReader(c.raw), c.id, false)
		if err == nil || !c.is(err) {
			t.Errorf("%s: %v (%T)", name, err, errors.Unwrap(err))
		}
	}
	if err := h.d.st.HandOff("r", b.Record.Head()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.ImportWith(t.Context(), bytes.NewReader(b.Tar(nil)), "", false); !errors.Is(err, store.ErrNotExtension) {
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

// is and as match an error's identity: the daemon's refusals are typed, and
// internal/server maps each type to its code (its errors_test.go).
func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func as[T error](err error) bool {
	var t T
	return errors.As(err, &t)
}
