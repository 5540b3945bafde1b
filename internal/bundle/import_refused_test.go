package bundle_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// refusingStore is a store that refuses to store a record (ImportAs,
// Extend) after everything before it passed: a disk that fails, a
// transaction that does not commit.
type refusingStore struct {
	*store.Store
	refusal           error
	importAs, extends int
}

func (s *refusingStore) ImportAs(string, *record.Record, bool) error {
	s.importAs++
	return s.refusal
}

func (s *refusingStore) Extend(string, *record.Record, bool, bool) (record.Address, error) {
	s.extends++
	return record.Address{}, s.refusal
}

// refusedKey signs the runs these tests import; the importing host trusts
// it.
var refusedKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, 32))

func refusedOptions() bundle.ImportOptions {
	k := attest.KeyID(refusedKey.Public().(ed25519.PublicKey))
	return bundle.ImportOptions{Options: bundle.Options{Trusted: func(a record.Address) bool { return a == k }}}
}

// refusedRun is a parked transcript run "held", signed by refusedKey.
func refusedRun(t *testing.T) *bundletest.Bundle {
	t.Helper()
	b, err := bundletest.Run{Spec: unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{"a"}},
		Grants: unit.Grants{Network: unit.NoNetwork}, Key: refusedKey, Transcript: []byte("{\"t\":1}\n")}.Forge("held")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// storeObjects lists the objects st holds, staging excluded.
func storeObjects(t *testing.T, dir string) []string {
	t.Helper()
	root := filepath.Join(dir, "objects")
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			out = append(out, strings.TrimPrefix(p, root))
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// runsOf describes st's runs: each id, head, length and handoff.
func runsOf(t *testing.T, st *store.Store) []string {
	t.Helper()
	ids, err := st.AllRuns()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, id := range ids {
		r, err := st.Run(id)
		if err != nil {
			t.Fatal(err)
		}
		h, off, _ := st.HandedOff(id)
		out = append(out, id+" "+r.Head.String()+" "+r.Phase.String()+" "+h.Head.String()+" "+map[bool]string{true: "handed-off", false: "held"}[off])
	}
	return out
}

// A store that refuses the record once the timeline was judged (a new
// run: ImportAs; a run handed off and extended: Extend) fails the import
// with its error, from a bundle (Import) as from objects already in the
// store (ImportStored). What the import promises then: the runs are as
// they were, the lock is released, the staged files are gone, and the
// objects it adopted are reached by no record — a collection with no grace
// leaves the store holding exactly what it held before, and it checks.
func TestImportRefusedByTheStore(t *testing.T) {
	refusal := errors.New("the store refuses the record")
	for _, c := range []struct {
		name   string
		extend bool
		stored bool
	}{
		{name: "import-as"},
		{name: "import-as-stored", stored: true},
		{name: "extend", extend: true},
		{name: "extend-stored", extend: true, stored: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			st, err := store.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			b := refusedRun(t)
			arriving := b
			if c.extend {
				// The run was here, handed off; it comes back one interval on.
				if _, err := bundle.Import(t.Context(), st, bytes.NewReader(b.Tar(nil)), refusedOptions()); err != nil {
					t.Fatal(err)
				}
				if err := st.HandOff("held", b.Record.Head()); err != nil {
					t.Fatal(err)
				}
				if arriving, err = b.Extend(refusedKey, []byte("{\"t\":2}\n")); err != nil {
					t.Fatal(err)
				}
			}
			runs, objs := runsOf(t, st), storeObjects(t, dir)
			rs := &refusingStore{Store: st, refusal: refusal}
			o := refusedOptions()
			locked, unlocked := 0, 0
			o.Lock = func(string) func() { locked++; return func() { unlocked++ } }
			if c.stored {
				for _, ob := range arriving.Objects {
					if _, err := st.PutBytes(ob.Bytes); err != nil {
						t.Fatal(err)
					}
				}
				_, err = bundle.ImportStored(t.Context(), rs, arriving.Record, bundle.StoredOptions{ImportOptions: o, Run: "held"})
			} else {
				_, err = bundle.Import(t.Context(), rs, bytes.NewReader(arriving.Tar(nil)), o)
			}
			if !errors.Is(err, refusal) {
				t.Fatalf("import into a refusing store: %v", err)
			}
			if c.extend && (rs.extends != 1 || rs.importAs != 0) || !c.extend && (rs.importAs != 1 || rs.extends != 0) {
				t.Fatalf("%d ImportAs, %d Extend", rs.importAs, rs.extends)
			}
			if locked != 1 || unlocked != 1 {
				t.Fatalf("the run's lock taken %d, released %d times", locked, unlocked)
			}
			if got := runsOf(t, st); !slices.Equal(got, runs) {
				t.Fatalf("runs after the refusal %q, were %q", got, runs)
			}
			if got := storeObjects(t, dir); len(got) <= len(objs) {
				t.Fatalf("the store holds %d objects after the refusal, %d before: nothing was adopted", len(got), len(objs))
			}
			if _, err := st.GC(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
			if got := storeObjects(t, dir); !slices.Equal(got, objs) {
				t.Fatalf("after a collection the store holds %d objects, held %d before the import", len(got), len(objs))
			}
			if _, err := st.Check(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
