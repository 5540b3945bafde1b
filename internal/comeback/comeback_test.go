package comeback

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func addr(b byte) record.Address {
	var a record.Address
	a[0] = b
	return a
}

func TestAddReplaceRemove(t *testing.T) {
	dir := t.TempDir()
	l := Open(dir)
	if es, err := l.Entries(); err != nil || len(es) != 0 {
		t.Fatalf("a new list: %v, %v", es, err)
	}
	for _, e := range []Entry{{"a", addr(1)}, {"b", addr(2)}, {"a", addr(3)}} {
		if err := l.Add(e.Run, e.Head); err != nil {
			t.Fatal(err)
		}
	}
	// Read back by another List, as the next start does.
	es, err := Open(dir).Entries()
	if err != nil || len(es) != 2 || es[0] != (Entry{"b", addr(2)}) || es[1] != (Entry{"a", addr(3)}) {
		t.Fatalf("entries %v, %v", es, err)
	}
	if err := l.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if es, err := l.Entries(); err != nil || len(es) != 1 || es[0].Run != "b" {
		t.Fatalf("after removing a: %v, %v", es, err)
	}
	if err := l.Remove("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, File)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the emptied list's file is still there: %v", err)
	}
}

func TestDamagedFile(t *testing.T) {
	for name, body := range map[string]string{
		"not json":      "{",
		"unknown field": `{"version":1,"runs":[],"extra":1}`,
		"version":       `{"version":2,"runs":[]}`,
		"no head":       `{"version":1,"runs":[{"run":"a"}]}`,
		"bad head":      `{"version":1,"runs":[{"run":"a","head":"b3:zz"}]}`,
		"trailing":      `{"version":1,"runs":[]} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, File), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			l := Open(dir)
			if _, err := l.Entries(); !errors.Is(err, ErrDamaged) {
				t.Fatalf("err %v, want ErrDamaged", err)
			}
			// An Add replaces a damaged list rather than failing forever.
			if err := l.Add("a", addr(1)); err != nil {
				t.Fatal(err)
			}
			if es, err := l.Entries(); err != nil || len(es) != 1 {
				t.Fatalf("after an add: %v, %v", es, err)
			}
		})
	}
}
