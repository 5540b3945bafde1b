package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func writeString(s string) func(*os.File) error {
	return func(f *os.File) error {
		_, err := f.WriteString(s)
		return err
	}
}

// mustOnly fails unless dir holds exactly the names given: no temporary
// file is left beside them.
func mustOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, " ") != strings.Join(names, " ") {
		t.Fatalf("%s holds %q, want %q", dir, got, names)
	}
}

func mustContent(t *testing.T, p, want string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil || string(b) != want {
		t.Fatalf("%s: %q, %v; want %q", p, b, err, want)
	}
	info, err := os.Stat(p)
	if err != nil || info.Mode().Perm() != perm {
		t.Fatalf("%s: mode %v, %v; want %v", p, info.Mode().Perm(), err, perm)
	}
}

// The content and the mode land, whatever the umask and whether or not a
// file was there; a read-only mode does not stop the write.
func TestWrite(t *testing.T) {
	defer syscall.Umask(syscall.Umask(0o077))
	for _, put := range []struct {
		name string
		fn   func(string, os.FileMode, func(*os.File) error) error
	}{{"Write", Write}, {"WriteNoSync", WriteNoSync}} {
		t.Run(put.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f")
			for i, perm := range []os.FileMode{0o644, 0o600, 0o400, 0o755} {
				want := fmt.Sprintf("content %d", i)
				if err := put.fn(p, perm, writeString(want)); err != nil {
					t.Fatal(err)
				}
				mustContent(t, p, want, perm)
				mustOnly(t, dir, "f")
			}
		})
	}
}

// A failing write leaves no file and no temporary file, and an existing
// file as it was; its error is returned as it is.
func TestWriteFails(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	boom := errors.New("boom")
	half := func(f *os.File) error {
		f.WriteString("half")
		return boom
	}
	if err := Write(p, 0o600, half); !errors.Is(err, boom) {
		t.Fatalf("write: %v", err)
	}
	mustOnly(t, dir)
	if err := Write(p, 0o600, writeString("old")); err != nil {
		t.Fatal(err)
	}
	for _, fn := range []func(string, os.FileMode, func(*os.File) error) error{Write, WriteNoSync, Create} {
		if err := fn(p, 0o644, half); !errors.Is(err, boom) {
			t.Fatalf("write: %v", err)
		}
		mustContent(t, p, "old", 0o600)
		mustOnly(t, dir, "f")
	}
	// A mode beyond the permission bits is refused before anything.
	if err := Write(filepath.Join(dir, "g"), os.ModeSetuid|0o755, writeString("x")); err == nil {
		t.Fatal("setuid mode accepted")
	}
	// A directory that is not there: nothing to clean up, and an error.
	if err := Write(filepath.Join(dir, "none", "f"), 0o600, writeString("x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing directory: %v", err)
	}
	mustOnly(t, dir, "f")
}

// Create makes a file that is absent, and refuses, with fs.ErrExist, one
// that is there, leaving it intact.
func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := Create(p, 0o600, writeString("first")); err != nil {
		t.Fatal(err)
	}
	mustContent(t, p, "first", 0o600)
	err := Create(p, 0o644, writeString("second"))
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("create over a file: %v", err)
	}
	mustContent(t, p, "first", 0o600)
	mustOnly(t, dir, "key")
	// Not even a dangling symbolic link is followed or replaced.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "target"), link); err != nil {
		t.Fatal(err)
	}
	if err := Create(link, 0o600, writeString("x")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("create over a symlink: %v", err)
	}
	mustOnly(t, dir, "key", "link")
}

// Of concurrent Writes to one path, one whole content remains; of
// concurrent Creates, exactly one succeeds and its content remains.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	contents := make([]string, 16)
	for i := range contents {
		contents[i] = strings.Repeat(string(rune('a'+i)), 64<<10+i)
	}
	var wg sync.WaitGroup
	for _, c := range contents {
		wg.Go(func() {
			// In pieces, so that interleaving would show.
			err := Write(p, 0o600, func(f *os.File) error {
				for i := 0; i < len(c); i += 4096 {
					if _, err := f.WriteString(c[i:min(i+4096, len(c))]); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	whole := false
	for _, c := range contents {
		whole = whole || bytes.Equal(b, []byte(c))
	}
	if !whole {
		t.Fatalf("%d bytes, not one whole content", len(b))
	}
	mustOnly(t, dir, "f")

	q := filepath.Join(dir, "once")
	var (
		mu  sync.Mutex
		won []string
	)
	for _, c := range contents {
		wg.Go(func() {
			err := Create(q, 0o600, writeString(c))
			switch {
			case err == nil:
				mu.Lock()
				won = append(won, c)
				mu.Unlock()
			case !errors.Is(err, fs.ErrExist):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d creates succeeded", len(won))
	}
	mustContent(t, q, won[0], 0o600)
	mustOnly(t, dir, "f", "once")
}

func TestSyncDir(t *testing.T) {
	if err := SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(t.TempDir(), "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing directory: %v", err)
	}
}
