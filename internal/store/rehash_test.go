package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Rehash answers what the stored bytes hash to now: the address itself
// while intact, another once a byte changed (not an error), and
// ErrMissingObject for an object that is gone.
func TestRehash(t *testing.T) {
	s := mustStore(t)
	for _, n := range []int{0, 1, 1024, 1025, smallObject - 1, smallObject, smallObject + 1, 3<<20 + 7} {
		b := []byte(strings.Repeat("r", n))
		a := put(t, s, string(b))
		if got, err := s.Rehash(t.Context(), a); err != nil || got != a {
			t.Fatalf("%d bytes intact: %s, %v; want %s", n, got, err, a)
		}
		if n == 0 {
			continue
		}
		damage(t, s, a, flipByte(n/2))
		edited := append([]byte(nil), b...)
		edited[n/2] ^= 0x01
		if got, err := s.Rehash(t.Context(), a); err != nil || got != record.Sum(edited) {
			t.Fatalf("%d bytes edited: %s, %v; want %s", n, got, err, record.Sum(edited))
		}
		if err := s.Verify(t.Context(), a); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("verify of the edited object: %v", err)
		}
	}
	gone := record.Sum([]byte("never stored"))
	if _, err := s.Rehash(t.Context(), gone); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("missing: %v", err)
	}
}

// RehashDir rebuilds a directory's listing over its files' current hashes:
// the directory itself while intact; the listing of the edited bytes when
// one file changed; the edited listing's own hash when the listing
// changed; ErrMissingObject, naming the file, when one is gone.
func TestRehashDir(t *testing.T) {
	s := mustStore(t)
	files := map[string]string{
		"pages-1.img":  strings.Repeat("p", 3<<20+11),
		"core-1.img":   "core",
		"sub/deep/y.z": "y",
	}
	stage, err := s.StagingDir("criu")
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, stage, files)
	dir, _, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.RehashDir(t.Context(), dir); err != nil || got != dir {
		t.Fatalf("intact: %s, %v; want %s", got, err, dir)
	}

	// One byte of one file: the listing those bytes make.
	pages := record.Sum([]byte(files["pages-1.img"]))
	damage(t, s, pages, flipByte(1<<20))
	es, err := s.Listing(dir)
	if err != nil {
		t.Fatal(err)
	}
	edited := []byte(files["pages-1.img"])
	edited[1<<20] ^= 0x01
	for i := range es {
		if es[i].Name == "pages-1.img" {
			es[i].Address = record.Sum(edited)
		}
	}
	want, err := EncodeListing(es)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.RehashDir(t.Context(), dir)
	if err != nil || got != record.Sum(want) || got == dir {
		t.Fatalf("one file edited: %s, %v; want %s", got, err, record.Sum(want))
	}
	damage(t, s, pages, flipByte(1<<20))
	if got, err := s.RehashDir(t.Context(), dir); err != nil || got != dir {
		t.Fatalf("restored: %s, %v; want %s", got, err, dir)
	}

	// The listing's own bytes: their hash, whether or not they decode.
	raw, err := os.ReadFile(s.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	damage(t, s, dir, flipByte(3))
	raw[3] ^= 0x01
	if got, err := s.RehashDir(t.Context(), dir); err != nil || got != record.Sum(raw) {
		t.Fatalf("listing edited: %s, %v; want %s", got, err, record.Sum(raw))
	}
	damage(t, s, dir, flipByte(3))

	// A file gone.
	core := record.Sum([]byte("core"))
	if err := os.Rename(s.Path(core), s.Path(core)+".away"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RehashDir(t.Context(), dir); !errors.Is(err, ErrMissingObject) || !strings.Contains(err.Error(), "core-1.img") {
		t.Fatalf("file missing: %v", err)
	}
	if err := os.Rename(s.Path(core)+".away", s.Path(core)); err != nil {
		t.Fatal(err)
	}
	// The listing gone.
	if _, err := s.RehashDir(t.Context(), record.Sum([]byte("no listing"))); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("listing missing: %v", err)
	}
	// A cancelled rehash says so.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.RehashDir(ctx, dir); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// LinkRehashed links as LinkFiles does, without hashing again: it lays
// out even a file damaged since (its caller has just rehashed the
// directory), where LinkFiles refuses.
func TestMaterializeLinkRehashed(t *testing.T) {
	s := mustStore(t)
	files := map[string]string{"pages-1.img": strings.Repeat("p", 10000), "sub/core-1.img": "core"}
	stage, _ := s.StagingDir("criu")
	writeTree(t, stage, files)
	dir, _, err := s.Ingest(t.Context(), stage)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "restore")
	if err := s.Materialize(t.Context(), dir, out, LinkRehashed); err != nil {
		t.Fatal(err)
	}
	for name, c := range files {
		p := filepath.Join(out, filepath.FromSlash(name))
		if b, _ := os.ReadFile(p); string(b) != c {
			t.Fatalf("%s: %d bytes", name, len(b))
		}
		if info, _ := os.Stat(p); info.Mode().Perm() != 0o400 {
			t.Fatalf("%s: not the read-only object: %v", name, info.Mode())
		}
	}
	damage(t, s, record.Sum([]byte("core")), flipByte(0))
	if err := s.Materialize(t.Context(), dir, filepath.Join(t.TempDir(), "checked"), LinkFiles); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("LinkFiles over a damaged file: %v", err)
	}
	if err := s.Materialize(t.Context(), dir, filepath.Join(t.TempDir(), "trusted"), LinkRehashed); err != nil {
		t.Fatalf("LinkRehashed hashed again: %v", err)
	}
}

// BenchmarkRehash rehashes a stored 256 MiB file, as a resume's first
// precondition does its memory image, against Verify's blake3.Hasher.
func BenchmarkRehash(b *testing.B) {
	s := mustStore(b)
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i*31 + i>>9)
	}
	a, err := s.PutBytes(data)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Rehash", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if got, err := s.Rehash(context.Background(), a); err != nil || got != a {
				b.Fatal(got, err)
			}
		}
	})
	b.Run("Verify", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if err := s.Verify(context.Background(), a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
