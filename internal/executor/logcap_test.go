package executor

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// A log a writer appends to is copied to .1 and emptied in place once it
// holds max bytes; the writer's next bytes start the new log; older
// copies shift up to keep and no further.
func TestCappedLog(t *testing.T) {
	dir := t.TempDir()
	l := cappedLog{path: filepath.Join(dir, "c.log"), max: 100, keep: 2}
	if did, err := l.rotate(); did || err != nil {
		t.Fatalf("no log yet: rotated %v, %v", did, err)
	}
	w, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write := func(b byte, n int) {
		t.Helper()
		if _, err := w.Write(bytes.Repeat([]byte{b}, n)); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write('a', 99)
	if did, err := l.rotate(); did || err != nil {
		t.Fatalf("under max: rotated %v, %v", did, err)
	}
	write('a', 1)
	if did, err := l.rotate(); !did || err != nil {
		t.Fatalf("at max: rotated %v, %v", did, err)
	}
	write('b', 3)
	if got := read(l.path); got != "bbb" {
		t.Fatalf("the log after a rotation: %q, want the writer's new bytes at its start", got)
	}
	if got := read(l.gen(1)); got != string(bytes.Repeat([]byte{'a'}, 100)) {
		t.Fatalf(".1: %d bytes", len(got))
	}
	write('b', 200)
	if did, err := l.rotate(); !did || err != nil {
		t.Fatal(did, err)
	}
	write('c', 150)
	if did, err := l.rotate(); !did || err != nil {
		t.Fatal(did, err)
	}
	if a, b, c := read(l.gen(2)), read(l.gen(1)), read(l.path); len(a) != 203 || a[0] != 'b' || len(b) != 150 || b[0] != 'c' || c != "" {
		t.Fatalf(".2 %d bytes, .1 %d bytes, log %q", len(a), len(b), c)
	}
	if _, err := os.Stat(l.gen(3)); !os.IsNotExist(err) {
		t.Fatalf("a third copy: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 {
		t.Fatalf("files left: %v", ents)
	}
}
