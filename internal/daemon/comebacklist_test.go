package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func comebackAddr(b byte) record.Address {
	var a record.Address
	a[0] = b
	return a
}

func TestComebackAddReplaceRemove(t *testing.T) {
	dir := t.TempDir()
	l := openComeback(dir)
	if es, err := l.Entries(); err != nil || len(es) != 0 {
		t.Fatalf("a new list: %v, %v", es, err)
	}
	for _, e := range []comebackEntry{{"a", comebackAddr(1)}, {"b", comebackAddr(2)}, {"a", comebackAddr(3)}} {
		if err := l.Add(e.Run, e.Head); err != nil {
			t.Fatal(err)
		}
	}
	// Read back by another comebackList, as the next start does.
	es, err := openComeback(dir).Entries()
	if err != nil || len(es) != 2 || es[0] != (comebackEntry{"b", comebackAddr(2)}) || es[1] != (comebackEntry{"a", comebackAddr(3)}) {
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
	if _, err := os.Stat(filepath.Join(dir, comebackFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the emptied list's file is still there: %v", err)
	}
}

func TestComebackDamagedFile(t *testing.T) {
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
			if err := os.WriteFile(filepath.Join(dir, comebackFile), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			l := openComeback(dir)
			if _, err := l.Entries(); !errors.Is(err, errComebackDamaged) {
				t.Fatalf("err %v, want errComebackDamaged", err)
			}
			// An Add replaces a damaged list rather than failing forever.
			if err := l.Add("a", comebackAddr(1)); err != nil {
				t.Fatal(err)
			}
			if es, err := l.Entries(); err != nil || len(es) != 1 {
				t.Fatalf("after an add: %v, %v", es, err)
			}
		})
	}
}
