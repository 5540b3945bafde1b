package daemon

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/pkg/bundle"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/store"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

var updateGolden = flag.Bool("update-export", false, "rewrite pkg/bundle/testdata/export from this exporter")

// exportFixture fills st with the runs whose bundles are pinned in
// pkg/bundle/testdata/export: "t", a forged transcript run of one
// interval, and "i", an image run of two intervals whose snapshots share a
// file and whose attestations share a journal.
func exportFixture(t testing.TB, st *store.Store) {
	t.Helper()
	ctx := context.Background()
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))
	r := bundletest.Run{Spec: unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{"a"}},
		Grants: unit.Grants{Network: unit.NoNetwork}, Key: key, Transcript: []byte("{\"t\":1}\n"),
		Calls: []protocol.Call{{ID: "c1", Kind: "http", Payload: []byte(`{}`)}}}
	b, err := r.Forge("t")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := bundle.Stage(ctx, st, bytes.NewReader(b.Tar(nil)), bundle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sb.Adopt(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := st.ImportAs("t", sb.Record, false); err != nil {
		t.Fatal(err)
	}
	put := func(s string, refs ...record.Address) record.Address {
		t.Helper()
		a, err := st.PutBytes([]byte(s), refs...)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	listing := func(files ...string) record.Address {
		t.Helper()
		var es []store.Entry
		var refs []record.Address
		for _, f := range files {
			a := put("bytes of " + f)
			es = append(es, store.Entry{Name: f, Mode: 0o600, Size: uint64(len("bytes of " + f)), Address: a})
			refs = append(refs, a)
		}
		lb, err := store.EncodeListing(es)
		if err != nil {
			t.Fatal(err)
		}
		return put(string(lb), refs...)
	}
	head, err := st.Create("i", put("unit i"), put("grants i"))
	if err != nil {
		t.Fatal(err)
	}
	journal := put("journal")
	mem1, mem2 := listing("core-1.img", "pages-1.img"), listing("core-1.img", "pages-2.img")
	snap1 := record.ImageSnapshot(listing("etc/hosts", "bin/unit"), &mem1)
	snap2 := record.ImageSnapshot(listing("etc/hosts", "bin/unit", "tmp/out"), &mem2)
	if _, err := st.AppendAll("i", head,
		record.Execution(put("attestation 1", put("receipt 1"), journal), nil),
		record.Suspension(snap1, put("manifest 1")),
		record.Resumption(snap1, 7, record.Estimated),
		record.Execution(put("attestation 2", put("receipt 2"), journal), &record.CallAccount{Dispatched: []string{"x"}}),
		record.Suspension(snap2, put("manifest 2"))); err != nil {
		t.Fatal(err)
	}
}

// The exporter as it stands writes the bundles pinned in
// pkg/bundle/testdata/export, byte for byte.
func TestExportGolden(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.runs = map[string]*run{}
	h.d.cfg.StateDir = t.TempDir()
	exportFixture(t, h.d.st)
	for _, c := range []struct {
		run     string
		handoff bool
		file    string
	}{{"t", true, "transcript.bundle"}, {"i", false, "image-copy.bundle"}} {
		var b bytes.Buffer
		if err := h.d.Export(t.Context(), c.run, &b, c.handoff); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join("..", "bundle", "testdata", "export", c.file)
		if *updateGolden {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("%s: the export differs from %s", c.run, p)
		}
	}
}
