package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func hashedOf(content string) Hashed {
	return Hashed{Size: int64(len(content)), Address: record.Sum([]byte(content))}
}

// Files given with their hash are taken as hashed, the others hashed here;
// the directory object is the one Ingest makes of the same tree, and its
// files are the staged inodes, renamed.
func TestIngestHashed(t *testing.T) {
	s := mustStore(t)
	files := map[string]string{
		"pages-1.img":  strings.Repeat("p", 3<<20),
		"core-1.img":   "core",
		"sub/deep/y.z": "y",
		"empty.img":    "",
	}
	want := func() record.Address {
		stage, _ := s.StagingDir("plain")
		writeTree(t, stage, files)
		a, _, err := s.Ingest(t.Context(), stage)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}()

	// Fresh bytes for pages-1.img, so that its object is new and renamed.
	files["pages-1.img"] = strings.Repeat("q", 3<<20)
	stage, err := s.StagingDir("followed")
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, stage, files)
	var staged syscall.Stat_t
	syscall.Stat(filepath.Join(stage, "pages-1.img"), &staged)
	known := map[string]Hashed{
		"pages-1.img":  hashedOf(files["pages-1.img"]),
		"sub/deep/y.z": hashedOf(files["sub/deep/y.z"]),
		"empty.img":    hashedOf(""),
	}
	a, st, err := s.IngestHashed(t.Context(), stage, known)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 4 || st.New != 1 || st.Bytes != 3<<20+4+1 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := os.Stat(stage); !os.IsNotExist(err) {
		t.Fatal("staging not removed")
	}
	var stored syscall.Stat_t
	syscall.Stat(s.Path(known["pages-1.img"].Address), &stored)
	if stored.Ino != staged.Ino || stored.Dev != staged.Dev {
		t.Fatal("ingest copied a file instead of renaming it")
	}
	if info, _ := os.Stat(s.Path(known["pages-1.img"].Address)); info.Mode().Perm() != 0o400 {
		t.Fatalf("object mode %v", info.Mode())
	}
	if err := s.VerifyDir(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	es, err := s.Listing(a)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Address != record.Sum([]byte(files[e.Name])) || e.Size != uint64(len(files[e.Name])) {
			t.Errorf("%s: %d bytes at %s", e.Name, e.Size, e.Address)
		}
	}
	if refs, _ := s.Refs(a); len(refs) != 4 {
		t.Fatalf("the listing declares %d refs, want its 4 files", len(refs))
	}

	// Knowing nothing is Ingest: the first tree again gives its address.
	files["pages-1.img"] = strings.Repeat("p", 3<<20)
	stage, _ = s.StagingDir("again")
	writeTree(t, stage, files)
	if a, _, err := s.IngestHashed(t.Context(), stage, nil); err != nil || a != want {
		t.Fatalf("nothing known: %s, want %s (%v)", a, want, err)
	}
}

// The store does not rehash what it is given: a wrong address is stored
// as given (the caller vouched for it), and verification finds it.
func TestIngestHashedTrustsTheCaller(t *testing.T) {
	s := mustStore(t)
	stage, _ := s.StagingDir("wrong")
	writeTree(t, stage, map[string]string{"pages-1.img": "the bytes", "core-1.img": "core"})
	wrong := hashedOf("other bytes")
	wrong.Size = int64(len("the bytes"))
	a, _, err := s.IngestHashed(t.Context(), stage, map[string]Hashed{"pages-1.img": wrong})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(t.Context(), wrong.Address); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("verify the wrongly named object: %v", err)
	}
	err = s.VerifyDir(t.Context(), a)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages-1.img") {
		t.Fatalf("verify the directory: %v", err)
	}
	// The file not given was hashed.
	if err := s.Verify(t.Context(), record.Sum([]byte("core"))); err != nil {
		t.Fatal(err)
	}
}

// What the store can check of a given hash, it does: the file is staged
// and has the size hashed. A refused ingest names nothing and leaves the
// staging directory as it was.
func TestIngestHashedRefuses(t *testing.T) {
	s := mustStore(t)
	for name, known := range map[string]map[string]Hashed{
		"not staged": {"pages-2.img": hashedOf("x")},
		"grew":       {"pages-1.img": hashedOf("the byte")},
		"shrank":     {"pages-1.img": hashedOf("the bytes!")},
		"directory":  {"sub": hashedOf("")},
	} {
		stage, _ := s.StagingDir("bad")
		writeTree(t, stage, map[string]string{"pages-1.img": "the bytes", "sub/core-1.img": "core"})
		if _, _, err := s.IngestHashed(t.Context(), stage, known); err == nil {
			t.Errorf("%s: ingested", name)
		}
		if b, err := os.ReadFile(filepath.Join(stage, "pages-1.img")); err != nil || string(b) != "the bytes" {
			t.Errorf("%s: staging changed: %q %v", name, b, err)
		}
		if s.Has(record.Sum([]byte("the bytes"))) {
			t.Errorf("%s: a file was stored", name)
		}
	}
}
