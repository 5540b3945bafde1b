package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundletest"
)

// The daemon's export (Exportable, then bundle.Prepare and bundle.Export
// under its bookkeeping) writes the bundles pinned in
// internal/bundle/testdata/export byte for byte (format 2: packs of the
// small objects; the format-1 bundles the exporter wrote before, as
// internal/daemon had it, are kept beside them as *.1.bundle, and
// internal/bundle's TestImportFormat1 imports them).
func TestExportGolden(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = &runTable{st: h.d.st}
	h.d.cfg.StateDir = t.TempDir()
	h.d.wire()
	if err := bundletest.Pinned(t.Context(), h.d.st); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		run     string
		handoff bool
		file    string
	}{{"t", true, "transcript.bundle"}, {"i", false, "image-copy.bundle"}} {
		var b bytes.Buffer
		if err := h.d.exporter.Export(t.Context(), c.run, &b, c.handoff); err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("..", "bundle", "testdata", "export", c.file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("%s: the export differs from testdata/export/%s", c.run, c.file)
		}
		if _, off, _ := h.d.st.HandedOff(c.run); off != c.handoff {
			t.Fatalf("%s: handed off %v after an export with handoff %v", c.run, off, c.handoff)
		}
	}
}
