package bundle_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// mustExport exports run from st as an exporting host does: Prepare
// (handing it off unless not handoff), then Export.
func mustExport(t testing.TB, st bundle.Store, run string, handoff bool) []byte {
	t.Helper()
	o, _, err := bundle.Prepare(st, run, handoff)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := bundle.Export(context.Background(), st, run, &b, o); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Export writes, byte for byte, the format-2 bundles pinned in
// testdata/export/{transcript,image-copy}.bundle (written by this exporter
// when format 2 came in, from the store bundletest.Pinned fills; the
// daemon's TestExportGolden pins the same files): a transcript run handed
// off, and an image run of two intervals exported as a copy. The format-1
// bundles beside them (testdata/export/*.1.bundle, written at commit
// 0259b92 by internal/daemon's exporter from the same store, under the
// names the format-2 ones have now) still import, and the run they carry
// exports as the same format-2 bytes (TestImportFormat1).
func TestExportGolden(t *testing.T) {
	st, _ := mustStore(t)
	if err := bundletest.Pinned(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	for _, c := range goldens {
		want, err := os.ReadFile(filepath.Join("testdata", "export", c.file2))
		if err != nil {
			t.Fatal(err)
		}
		if got := mustExport(t, st, c.run, c.handoff); !bytes.Equal(got, want) {
			t.Fatalf("%s: the export differs from testdata/export/%s", c.run, c.file2)
		}
		// Read from the store (no Record given), the same bytes.
		var b bytes.Buffer
		if err := bundle.Export(context.Background(), st, c.run, &b, bundle.ExportOptions{Copy: !c.handoff}); err != nil || !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("%s: export reading the record itself: %v, or other bytes", c.run, err)
		}
	}
}

// goldens are the pinned bundles of bundletest.Pinned's runs: file in
// format 1, file2 in format 2 (what Export writes).
var goldens = []struct {
	run         string
	handoff     bool
	file, file2 string
}{{"t", true, "transcript.1.bundle", "transcript.bundle"}, {"i", false, "image-copy.1.bundle", "image-copy.bundle"}}

// A format-1 bundle, as exporters wrote before format 2, still imports:
// the pinned transcript run's imports into an empty store, and exports
// from there as its format-2 twin's bytes. Each pinned format-1 bundle
// carries the header, record and objects, in the same order, of its twin
// (the image run's forged objects are not judged: an import refuses them).
func TestImportFormat1(t *testing.T) {
	for _, c := range goldens {
		one, err := os.ReadFile(filepath.Join("testdata", "export", c.file))
		if err != nil {
			t.Fatal(err)
		}
		two, err := os.ReadFile(filepath.Join("testdata", "export", c.file2))
		if err != nil {
			t.Fatal(err)
		}
		h1, r1, o1 := readBundle(t, one)
		h2, r2, o2 := readBundle(t, two)
		if h1.Format != bundle.Format1 || h2.Format != bundle.Format2 || len(o1) == 0 || !slices.Equal(o1, o2) || !bytes.Equal(r1, r2) {
			t.Fatalf("%s: format 1 %+v and %d objects, format 2 %+v and %d", c.run, h1, len(o1), h2, len(o2))
		}
		if h1.Format = h2.Format; h1 != h2 {
			t.Fatalf("%s: format 1 %+v, format 2 %+v", c.run, h1, h2)
		}
	}
	st, _ := mustStore(t)
	c := goldens[0]
	raw, _ := os.ReadFile(filepath.Join("testdata", "export", c.file))
	im, err := bundle.Import(context.Background(), st, bytes.NewReader(raw), bundle.ImportOptions{})
	if err != nil || im.Header.Format != bundle.Format1 || im.Run != c.run {
		t.Fatalf("%s: %+v, %v", c.file, im.Header, err)
	}
	want, _ := os.ReadFile(filepath.Join("testdata", "export", c.file2))
	if got := mustExport(t, st, c.run, c.handoff); !bytes.Equal(got, want) {
		t.Fatalf("%s: the run of the format-1 bundle exports as other bytes", c.run)
	}
}

// readBundle reads a bundle of either format without judging it
// (bundletest.Read): its header, its record's bytes, and its objects'
// bytes in order, a pack's in the order it carries them.
func readBundle(t testing.TB, raw []byte) (bundle.Header, []byte, []string) {
	t.Helper()
	b, h, err := bundletest.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	var objs []string
	for _, o := range b.Objects {
		objs = append(objs, string(o.Bytes))
	}
	return h, b.Record.EncodeWire(), objs
}

// Reached lists each object after its refs, once, the unit spec and grant
// set first; without images it leaves out the image snapshots.
func TestReached(t *testing.T) {
	st, _ := mustStore(t)
	if err := bundletest.Pinned(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Record("i")
	if err != nil {
		t.Fatal(err)
	}
	all, err := bundle.Reached(st, rec, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 19 || all[0] != rec.Unit() || all[1] != rec.Grants() {
		t.Fatalf("%d objects, starting %v", len(all), all[:2])
	}
	at := map[record.Address]int{}
	for i, a := range all {
		if _, twice := at[a]; twice {
			t.Fatalf("%s listed twice", a)
		}
		at[a] = i
		refs, _ := st.Refs(a)
		for _, r := range refs {
			if j, ok := at[r]; !ok || j > i {
				t.Fatalf("%s listed before its ref %s", a, r)
			}
		}
	}
	evidence, err := bundle.Reached(st, rec, false)
	if err != nil {
		t.Fatal(err)
	}
	// Unit, grants, two attestations with their receipts and one journal,
	// two manifests.
	if len(evidence) != 9 {
		t.Fatalf("without images, %d objects", len(evidence))
	}
}

// Prepare hands a run off once, exports a copy without handoff or when
// this host holds only a copy, and refuses a run that is not parked.
func TestPrepare(t *testing.T) {
	st, _ := mustStore(t)
	b := forge(t, nil)
	mustImport(t, st, b.Tar(nil), iopts())
	o, made, err := bundle.Prepare(st, "forged", false)
	if err != nil || made || !o.Copy || o.Record.Head() != b.Record.Head() {
		t.Fatalf("a copy: %+v, made %v, %v", o, made, err)
	}
	if _, off, _ := st.HandedOff("forged"); off {
		t.Fatal("handed off by a copy's export")
	}
	if o, made, err = bundle.Prepare(st, "forged", true); err != nil || !made || o.Copy {
		t.Fatalf("a handoff: %+v, made %v, %v", o, made, err)
	}
	if h, off, _ := st.HandedOff("forged"); !off || h.Copy || h.Head != b.Record.Head() {
		t.Fatalf("not handed off at its head: %+v", h)
	}
	// Exported again: the same handoff, not made again.
	if o, made, err = bundle.Prepare(st, "forged", true); err != nil || made || o.Copy {
		t.Fatalf("exported again: %+v, made %v, %v", o, made, err)
	}
	// A copy held here is exported as a copy, whatever is asked.
	cp, _ := mustStore(t)
	mustImport(t, cp, b.Tar(func(h *bundle.Header) { h.Copy = true }), iopts())
	if o, made, err = bundle.Prepare(cp, "forged", true); err != nil || made || !o.Copy {
		t.Fatalf("a copy held: %+v, made %v, %v", o, made, err)
	}
	if h, _, _ := cp.HandedOff("forged"); !h.Copy {
		t.Fatal("the copy is no longer one")
	}
}

// A run that is not parked, or not there, is not exported: Exportable,
// Prepare and Export all refuse it, and nothing is written or handed off.
func TestExportRefusesNotParked(t *testing.T) {
	st, _ := mustStore(t)
	u, _ := st.PutBytes([]byte("unit"))
	g, _ := st.PutBytes([]byte("grants"))
	head, err := st.Create("executing", u, g)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := st.Create("closed", g, u)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Append("closed", closed, record.Closure("done")); err != nil {
		t.Fatal(err)
	}
	for run, want := range map[string]error{"executing": record.ErrNotParked, "closed": record.ErrClosed, "nobody": store.ErrNoRun} {
		if err := bundle.Exportable(st, run); !errors.Is(err, want) {
			t.Fatalf("%s: Exportable: %v, want %v", run, err, want)
		}
		if _, _, err := bundle.Prepare(st, run, true); !errors.Is(err, want) {
			t.Fatalf("%s: Prepare: %v, want %v", run, err, want)
		}
		var b bytes.Buffer
		if err := bundle.Export(context.Background(), st, run, &b, bundle.ExportOptions{}); !errors.Is(err, want) || b.Len() != 0 {
			t.Fatalf("%s: Export: %v (%d bytes), want %v", run, err, b.Len(), want)
		}
		if _, off, _ := st.HandedOff(run); off {
			t.Fatalf("%s handed off", run)
		}
	}
	if h, _ := st.Head("executing"); h != head {
		t.Fatal("head moved")
	}
}

// An export reads every object verified: a missing one fails the export
// before the first byte; a damaged one fails it with a bundle that is not
// whole, which an import refuses.
func TestExportDamagedStore(t *testing.T) {
	st, _ := mustStore(t)
	b := forge(t, nil)
	mustImport(t, st, b.Tar(nil), iopts())
	tr := *b.Record.Segment(1).Snapshot.Transcript
	if err := os.Chmod(st.Path(tr), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(st.Path(tr), []byte("{\"t\":2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := bundle.Export(context.Background(), st, "forged", &out, bundle.ExportOptions{})
	var ce *store.CorruptError
	if !errors.As(err, &ce) {
		t.Fatalf("a damaged object: %v", err)
	}
	other, _ := mustStore(t)
	if _, err := bundle.Import(context.Background(), other, &out, iopts()); err == nil {
		t.Fatal("the bundle of a failed export was imported")
	}
	if err := os.Remove(st.Path(tr)); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := bundle.Export(context.Background(), st, "forged", &out, bundle.ExportOptions{}); !errors.Is(err, store.ErrMissingObject) || out.Len() != 0 {
		t.Fatalf("a missing object: %v, %d bytes written", err, out.Len())
	}
	// Repaired, for the store's check at the end.
	if err := os.WriteFile(st.Path(tr), b.Object(tr), 0o444); err != nil {
		t.Fatal(err)
	}
}

// HeldHere refuses a run handed off, or held as a copy, with
// store.ErrHandedOff.
func TestHeldHere(t *testing.T) {
	st, _ := mustStore(t)
	b := forge(t, nil)
	mustImport(t, st, b.Tar(nil), iopts())
	if err := bundle.HeldHere(st, "forged"); err != nil {
		t.Fatal(err)
	}
	if err := st.HandOff("forged", b.Record.Head()); err != nil {
		t.Fatal(err)
	}
	if err := bundle.HeldHere(st, "forged"); !errors.Is(err, store.ErrHandedOff) {
		t.Fatalf("handed off: %v", err)
	}
	cp, _ := mustStore(t)
	mustImport(t, cp, b.Tar(func(h *bundle.Header) { h.Copy = true }), iopts())
	if err := bundle.HeldHere(cp, "forged"); !errors.Is(err, store.ErrHandedOff) {
		t.Fatalf("a copy: %v", err)
	}
}

// members lists a bundle's member names.
func members(t testing.TB, b []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}
