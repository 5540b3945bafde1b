package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// stage writes content into a new staging directory and returns its path.
func stage(t *testing.T, s *Store, name, content string) string {
	t.Helper()
	dir, err := s.StagingDir("adopt")
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, dir, map[string]string{name: content})
	return filepath.Join(dir, filepath.FromSlash(name))
}

func TestAdopt(t *testing.T) {
	s := mustStore(t)
	receipt, journal := put(t, s, "receipt"), put(t, s, "journal")
	p := stage(t, s, "sub/att", "attestation")
	a, err := s.Adopt(t.Context(), p, receipt, journal)
	if err != nil {
		t.Fatal(err)
	}
	if a != record.Sum([]byte("attestation")) {
		t.Fatal("address is not the BLAKE3 of the bytes")
	}
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("staged file still there: %v", err)
	}
	if info, err := os.Stat(s.Path(a)); err != nil || info.Mode().Perm() != 0o400 {
		t.Fatalf("object file: %v", err)
	}
	if b, err := s.ReadAll(a); err != nil || string(b) != "attestation" {
		t.Fatalf("%q %v", b, err)
	}
	if refs, err := s.Refs(a); err != nil || !slices.Equal(refs, []record.Address{receipt, journal}) {
		t.Fatalf("refs %v %v", refs, err)
	}
	// Already stored: the staged copy is removed, the stored one kept, and
	// new refs added.
	other := put(t, s, "other")
	p = stage(t, s, "again", "attestation")
	if b, err := s.Adopt(t.Context(), p, other); err != nil || b != a {
		t.Fatalf("adopt again: %s %v", b, err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("staged duplicate still there: %v", err)
	}
	if refs, _ := s.Refs(a); !slices.Equal(refs, []record.Address{receipt, journal, other}) {
		t.Fatalf("refs after adopting again: %v", refs)
	}
	// An adopted object is reachable like a put one.
	h := mustCreate(t, s, "r")
	mustAppend(t, s, "r", h, record.Execution(a, nil))
	if st, err := s.GC(t.Context(), 0); err != nil || st.Live != 4 {
		t.Fatalf("gc %+v %v", st, err)
	}
	s = mustReopen(t, s)
	if err := s.Verify(t.Context(), a); err != nil {
		t.Fatal(err)
	}
}

func TestAdoptRefuses(t *testing.T) {
	s := mustStore(t)
	// A missing ref: refused, and the staged file left in place.
	p := stage(t, s, "f", "bytes")
	if _, err := s.Adopt(t.Context(), p, record.Sum([]byte("absent"))); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("missing ref: %v", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("a refused adoption removed the staged file: %v", err)
	}
	if s.Has(record.Sum([]byte("bytes"))) {
		t.Fatal("a refused adoption stored the object")
	}
	// Outside staging: elsewhere, objects/tmp itself, an object's own file.
	elsewhere := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(elsewhere, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	inTmp := filepath.Join(s.Dir(), "objects", "tmp", "loose")
	if err := os.WriteFile(inTmp, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	obj := put(t, s, "stored")
	dir := filepath.Dir(p)
	if err := os.Symlink(elsewhere, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(elsewhere), filepath.Join(dir, "linkdir")); err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]string{
		"elsewhere":            elsewhere,
		"loose in tmp":         inTmp,
		"an object":            s.Path(obj),
		"a staging directory":  dir,
		"a link":               filepath.Join(dir, "link"),
		"through a linked dir": filepath.Join(dir, "linkdir", "f"),
		"escaping by ..":       filepath.Join(dir, "..", "..", "..", "..", filepath.Base(filepath.Dir(elsewhere)), "f"),
		"missing":              filepath.Join(dir, "nothing"),
	} {
		if _, err := s.Adopt(t.Context(), q); err == nil {
			t.Errorf("%s: adopted", name)
		}
	}
	if _, err := os.Stat(elsewhere); err != nil {
		t.Fatal(err)
	}
	os.Remove(inTmp)
}
