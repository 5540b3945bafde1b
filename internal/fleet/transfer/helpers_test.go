package transfer_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

var key = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))

// mustStore opens a store in a temporary directory. When the test ends
// the store must pass store.Check and hold nothing in staging.
func mustStore(t testing.TB) *store.Store {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := st.Check(context.Background()); err != nil {
			t.Errorf("cleanup check: %v", err)
		}
		if left, _ := os.ReadDir(filepath.Join(dir, "objects", "tmp")); len(left) > 0 {
			t.Errorf("staging left behind: %v", left)
		}
		st.Close()
	})
	return st
}

func spec(mode unit.Mode, arg string) unit.Spec {
	return unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: mode, Args: []string{arg}}
}

// transcriptRun forges a parked transcript run and imports it into st.
func transcriptRun(t testing.TB, st *store.Store, id string) *record.Record {
	t.Helper()
	r := bundletest.Run{Spec: spec(unit.TranscriptMode, id), Grants: unit.Grants{Network: unit.NoNetwork}, Key: key,
		Transcript: []byte("{\"t\":1}\n" + id), Calls: []protocol.Call{{ID: "c1", Kind: "http", Payload: []byte(`{"url":"x"}`)}}}
	b, err := r.Forge(id)
	if err != nil {
		t.Fatal(err)
	}
	im, err := bundle.Import(context.Background(), st, bytes.NewReader(b.Tar(nil)), bundle.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return im.Record
}

func mustPut(t testing.TB, st *store.Store, b []byte, refs ...record.Address) record.Address {
	t.Helper()
	a, err := st.PutBytes(b, refs...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// ingest stages files (name → bytes) in st and ingests them as a
// directory object.
func ingest(t testing.TB, st *store.Store, files map[string][]byte) record.Address {
	t.Helper()
	dir, err := st.StagingDir("test")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, _, err := st.Ingest(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// imageRun stores in st, as a daemon would, a run parked once as an image:
// root the directory object of files, memory one of mem.
func imageRun(t testing.TB, st *store.Store, id string, files, mem map[string][]byte) *record.Record {
	t.Helper()
	sp := spec(unit.ImageMode, id)
	sc, err := sp.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	g := unit.Grants{Network: unit.NoNetwork}
	root, memory := ingest(t, st, files), ingest(t, st, mem)
	return parkedImage(t, st, id, mustPut(t, st, sc), mustPut(t, st, g.Encode()), root, memory)
}

// parkedImage stores the record unit, grants → Executed → Suspended
// (image root and memory) in st as run id, its evidence put as a daemon
// puts it.
func parkedImage(t testing.TB, st *store.Store, id string, ua, ga, root, memory record.Address) *record.Record {
	t.Helper()
	rc, _ := (&attest.Receipt{Provenance: record.Estimated, Method: "test", WindowNS: 1}).Canonical()
	var j attest.Journal
	rca, ja := mustPut(t, st, rc), mustPut(t, st, j.Encode())
	m := manifest.Manifest{}
	for _, k := range manifest.ImageKeys {
		m[k] = "x"
	}
	mc, _ := m.Canonical()
	rec := record.New(ua, ga)
	susp := record.Suspension(record.ImageSnapshot(root, &memory), mustPut(t, st, mc))
	c, _ := susp.Canonical()
	sig, err := attest.Sign(&attest.Body{Genesis: rec.Genesis(), Interval: 1, PrevHead: rec.Head(), StartNS: 1, EndNS: 2,
		Receipt: rca, Journal: ja, Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}}, key)
	if err != nil {
		t.Fatal(err)
	}
	att := mustPut(t, st, sig.Encode(), rca, ja)
	for _, seg := range []record.Segment{record.Execution(att, nil), susp} {
		if _, err := rec.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Import(id, rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// serve serves st's objects on a test server, through wrap if not nil.
func serve(t testing.TB, st *store.Store, wrap func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	h := transfer.Handler(st)
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// reached is what rec reaches in st, in export order.
func reached(t testing.TB, st *store.Store, rec *record.Record) []record.Address {
	t.Helper()
	objs, err := bundle.Reached(st, rec, true)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// held returns which of objs st holds.
func held(st *store.Store, objs []record.Address) []record.Address {
	var out []record.Address
	for _, a := range objs {
		if st.Has(a) {
			out = append(out, a)
		}
	}
	return out
}

func sameSet(a, b []record.Address) bool {
	less := func(x, y record.Address) int { return bytes.Compare(x[:], y[:]) }
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, less)
	slices.SortFunc(b, less)
	return slices.Equal(a, b)
}

func limits(object, total, json int64) bundle.Limits {
	return bundle.Limits{Object: object, Total: total, JSON: json}
}

// stored counts the objects in st (staging excluded).
func stored(t testing.TB, st *store.Store) int {
	t.Helper()
	n := 0
	root := filepath.Join(st.Dir(), "objects")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == filepath.Join(root, "tmp") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
