package idmap

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func open(t *testing.T, dir string, cfg Config) *Ranges {
	t.Helper()
	if cfg.Subordinate == nil {
		cfg.Subordinate = []string{}
	}
	r, err := Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTakeReleaseReopen: ranges are disjoint, a holder keeps its own,
// a released one is taken again, and a reopened directory holds what
// was held.
func TestTakeReleaseReopen(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, Config{Base: 1 << 20, Count: 3})
	a, err := r.Take("run-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Take("run-b")
	if err != nil {
		t.Fatal(err)
	}
	if a.Base != 1<<20 || b.Base != 1<<20+Size {
		t.Fatalf("ranges %d and %d", a.Base, b.Base)
	}
	if again, _ := r.Take("run-a"); again != a {
		t.Fatalf("run-a took %d, then %d", a.Base, again.Base)
	}
	if err := r.Release("run-a"); err != nil {
		t.Fatal(err)
	}
	if err := r.Release("run-a"); err != nil {
		t.Fatal("a second release:", err)
	}
	c, _ := r.Take("run-c")
	if c != a {
		t.Fatalf("run-c took %d, the free one is %d", c.Base, a.Base)
	}
	r2 := open(t, dir, Config{Base: 1 << 20, Count: 3})
	for h, want := range map[string]Range{"run-b": b, "run-c": c} {
		if got, ok := r2.Held(h); !ok || got != want {
			t.Errorf("reopened: %s holds %v %v, want %v", h, got, ok, want)
		}
	}
	if _, ok := r2.Held("run-a"); ok {
		t.Error("reopened: run-a still holds a range")
	}
}

// TestExhausted: a full window refuses with ErrExhausted.
func TestExhausted(t *testing.T) {
	r := open(t, t.TempDir(), Config{Count: 1})
	if _, err := r.Take("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Take("b"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("got %v, want ErrExhausted", err)
	}
}

// TestBind: a warm sandbox's range passes to the run that claims it,
// durably; a holder with none, or a run that holds one, is refused.
func TestBind(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir, Config{Count: 4})
	w, _ := r.Take("warm-1")
	if err := r.Bind("warm-1", "run-a"); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Held("run-a"); !ok || got != w {
		t.Fatalf("run-a holds %v %v, want %v", got, ok, w)
	}
	if _, ok := r.Held("warm-1"); ok {
		t.Fatal("warm-1 still holds its range")
	}
	if err := r.Bind("warm-1", "run-b"); !errors.Is(err, ErrHolder) {
		t.Fatalf("bind of no range: %v", err)
	}
	r.Take("warm-2")
	if err := r.Bind("warm-2", "run-a"); !errors.Is(err, ErrHolder) {
		t.Fatalf("bind to a holder: %v", err)
	}
	if got, ok := open(t, dir, Config{Count: 4}).Held("run-a"); !ok || got != w {
		t.Fatalf("reopened: run-a holds %v %v", got, ok)
	}
}

// TestConcurrentTakes: many holders at once get disjoint ranges.
func TestConcurrentTakes(t *testing.T) {
	r := open(t, t.TempDir(), Config{Count: 64})
	var mu sync.Mutex
	seen := map[Range]string{}
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			h := "run-" + string(rune('A'+i))
			g, err := r.Take(h)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if o, ok := seen[g]; ok {
				t.Errorf("%s and %s hold %d", o, h, g.Base)
			}
			seen[g] = h
		})
	}
	wg.Wait()
}

// TestOpenRefuses: a window not aligned, overflowing, or overlapping a
// user's subordinate ids; a directory holding what is not a range.
func TestOpenRefuses(t *testing.T) {
	sub := filepath.Join(t.TempDir(), "subuid")
	if err := os.WriteFile(sub, []byte("# users\nalice:100000:65536\nbob:1200000:65536\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"Unaligned", Config{Base: 1<<20 + 1, Subordinate: []string{}}},
		{"Overflow", Config{Base: 1 << 31, Count: 1 << 15, Subordinate: []string{}}},
		{"Subordinate", Config{Subordinate: []string{sub}}},
	} {
		if _, err := Open(t.TempDir(), c.cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", c.name, err)
		}
	}
	if _, err := Open(t.TempDir(), Config{Base: 1 << 22, Subordinate: []string{sub, "/nonexistent"}}); err != nil {
		t.Errorf("a window past the users' ids: %v", err)
	}
	for name, content := range map[string]string{"x": "run", "007": "run", "3": ""} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(dir, Config{Subordinate: []string{}}); !errors.Is(err, ErrDamaged) {
			t.Errorf("file %s holding %q: %v, want ErrDamaged", name, content, err)
		}
	}
	dir := t.TempDir()
	for _, n := range []string{"1", "2"} {
		os.WriteFile(filepath.Join(dir, n), []byte("run-a"), 0o600)
	}
	if _, err := Open(dir, Config{Subordinate: []string{}}); !errors.Is(err, ErrDamaged) {
		t.Errorf("one holder, two ranges: %v", err)
	}
}

// TestOpenRemovesLeftovers: an interrupted write's temporary file is
// removed, and its range is free.
func TestOpenRemovesLeftovers(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".0.tmp-123"), []byte("run-a"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := open(t, dir, Config{})
	if g, _ := r.Take("run-b"); g.Base != DefaultBase {
		t.Fatalf("took %d", g.Base)
	}
	if _, err := os.Stat(filepath.Join(dir, ".0.tmp-123")); !os.IsNotExist(err) {
		t.Fatal("the leftover is still there")
	}
}
