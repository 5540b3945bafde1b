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
// internal/bundle/testdata/export byte for byte: they were written by the
// exporter internal/daemon had before it moved to internal/bundle.
func TestExportGolden(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = map[string]*run{}
	h.d.cfg.StateDir = t.TempDir()
	if err := bundletest.Pinned(t.Context(), h.d.st); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		run     string
		handoff bool
		file    string
	}{{"t", true, "transcript.bundle"}, {"i", false, "image-copy.bundle"}} {
		var b bytes.Buffer
		if err := h.d.Export(t.Context(), c.run, &b, c.handoff); err != nil {
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
