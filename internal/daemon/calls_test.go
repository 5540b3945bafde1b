package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A daemon started on a state directory of a daemon before the call
// ledger brings its posted results in: results/RUN/sha256-HEX, written as
// that daemon wrote them, is posted to the ledger — listed as posted,
// held from an export — and results/ is gone.
func TestLegacyResultsBroughtIn(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = &runTable{st: h.d.st}
	h.d.cfg.StateDir = t.TempDir()
	h.d.wire()
	h.Start(t, "r")
	att := h.Put(t, []byte("attestation"))
	h.Append(t, "r", record.Execution(att, &record.CallAccount{Dispatched: []string{"c1", "c2"}}),
		record.Suspension(h.TranscriptPark(t, 16), h.Put(t, []byte("manifest"))))
	dir := filepath.Join(h.d.cfg.StateDir, "results", "r")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	name := sha256.Sum256([]byte("c1"))
	if err := atomicfile.Write(filepath.Join(dir, "sha256-"+hex.EncodeToString(name[:])), 0o600, func(f *os.File) error { _, err := f.Write([]byte(`{"ok":1}`)); return err }); err != nil {
		t.Fatal(err)
	}
	// As host.Open does when it opens the store at a start. The journal
	// here is no attestation, so the calls' payloads are not filled in: the
	// start logs that and goes on, and so does this test.
	_ = calls.Upgrade(h.d.st, filepath.Join(h.d.cfg.StateDir, "results"))
	if _, err := os.Stat(filepath.Dir(dir)); !os.IsNotExist(err) {
		t.Fatalf("results/ after the start: %v", err)
	}
	cs, err := calls.List(h.d.st)
	if err != nil || len(cs) != 2 || cs[0].ID != "c1" || !cs[0].ResultPosted || cs[1].ResultPosted || cs[0].Phase != record.PhaseParked {
		t.Fatalf("calls %+v %v", cs, err)
	}
	if err := h.d.exporter.Exportable("r"); !errors.Is(err, bundle.ErrResultsHeld) {
		t.Fatalf("export with the result brought in: %v", err)
	}
	if _, err := h.d.PostResult(t.Context(), "r", "c1", []byte(`{}`)); !errors.Is(err, calls.ErrRefused) {
		t.Fatalf("a second result: %v", err)
	}
}
