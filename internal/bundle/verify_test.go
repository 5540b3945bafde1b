package bundle_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Verify checks a stored run as an import checks its bundle: every object
// reached and rehashed, every signer reported; a damaged object fails it,
// with the record still reported.
func TestVerify(t *testing.T) {
	// Not mustStore: this test damages its store.
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	forged := forge(t, nil)
	mustImport(t, st, forged.Tar(nil), iopts())
	v, err := bundle.Verify(t.Context(), st, "forged", trusted, true)
	if err != nil || v.Record == nil || v.Record.Head() != forged.Record.Head() || v.Objects != len(forged.Objects) ||
		v.Bytes != bytesOf(forged) || len(v.Signers) != 1 || !v.Signers[0].Trusted {
		t.Fatalf("%+v, %v", v, err)
	}
	if v, err := bundle.Verify(t.Context(), st, "forged", func(record.Address) bool { return false }, true); err != nil || v.Signers[0].Trusted {
		t.Fatalf("a signer no longer trusted: %+v, %v", v, err)
	}
	if _, err := bundle.Verify(t.Context(), st, "nosuch", trusted, true); !errors.Is(err, store.ErrNoRun) {
		t.Fatalf("no such run: %v", err)
	}
	// Flip the bytes of every object file: the first the check reads fails.
	root := filepath.Join(dir, "objects")
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasPrefix(p, filepath.Join(root, "tmp")+"/") {
			b, _ := os.ReadFile(p)
			for i := range b {
				b[i] ^= 0xff
			}
			os.WriteFile(p, b, 0o600)
		}
		return nil
	})
	v, err = bundle.Verify(t.Context(), st, "forged", trusted, true)
	var ce *store.CorruptError
	if !errors.As(err, &ce) || v.Record == nil {
		t.Fatalf("damaged objects: %+v, %v", v, err)
	}
}
