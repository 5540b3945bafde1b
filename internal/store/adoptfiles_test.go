package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// stageAll writes files into one new staging directory and returns an
// Adoption for each, in the order given, each declaring refs[name].
func stageAll(t *testing.T, s *Store, names []string, content map[string]string, refs map[string][]record.Address) []Adoption {
	t.Helper()
	dir, err := s.StagingDir("adoptfiles")
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, dir, content)
	as := make([]Adoption, len(names))
	for i, n := range names {
		as[i] = Adoption{Path: filepath.Join(dir, n), Address: record.Sum([]byte(content[n])), Refs: refs[n]}
	}
	return as
}

func TestAdoptFiles(t *testing.T) {
	s := mustStore(t)
	held := put(t, s, "held")
	receipt, journal := record.Sum([]byte("receipt")), record.Sum([]byte("journal"))
	as := stageAll(t, s, []string{"receipt", "journal", "att", "again"},
		map[string]string{"receipt": "receipt", "journal": "journal", "att": "attestation", "again": "held"},
		map[string][]record.Address{"att": {receipt, journal}})
	if err := s.AdoptFiles(t.Context(), as); err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if _, err := os.Lstat(a.Path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still staged: %v", a.Path, err)
		}
		if info, err := os.Stat(s.Path(a.Address)); err != nil || info.Mode().Perm() != 0o400 {
			t.Errorf("object %s: %v", a.Address, err)
		}
		if err := s.Verify(t.Context(), a.Address); err != nil {
			t.Error(err)
		}
	}
	att := as[2].Address
	if refs, err := s.Refs(att); err != nil || !slices.Equal(refs, []record.Address{receipt, journal}) {
		t.Fatalf("refs %v %v", refs, err)
	}
	// Adopted objects are reachable as put ones are.
	h := mustCreate(t, s, "r")
	mustAppend(t, s, "r", h, record.Execution(att, nil))
	if st, err := s.GC(t.Context(), 0); err != nil || st.Live != 3 || st.Removed != 1 || s.Has(held) {
		t.Fatalf("gc %+v %v: want the attestation and its refs live, held (named by nothing) removed", st, err)
	}
}

// A refused batch names nothing and leaves every file staged: one file
// that does not hash to its address, a ref stored nowhere, a ref adopted
// only after the object that declares it.
func TestAdoptFilesRefuses(t *testing.T) {
	s := mustStore(t)
	other := record.Sum([]byte("other"))
	cases := map[string]struct {
		names []string
		refs  map[string][]record.Address
		bad   string // a file staged with other bytes than its address's
		want  error
	}{
		"corrupt":           {names: []string{"a", "b"}, bad: "b", want: ErrCorrupt},
		"missing ref":       {names: []string{"a", "b"}, refs: map[string][]record.Address{"b": {other}}, want: ErrMissingObject},
		"ref adopted after": {names: []string{"b", "a"}, refs: map[string][]record.Address{"b": {record.Sum([]byte("a bytes"))}}, want: ErrMissingObject},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			content := map[string]string{"a": "a bytes", "b": "b bytes " + name}
			as := stageAll(t, s, tc.names, content, tc.refs)
			for i := range as {
				if filepath.Base(as[i].Path) == tc.bad {
					as[i].Address = other
				}
			}
			if err := s.AdoptFiles(t.Context(), as); !errors.Is(err, tc.want) {
				t.Fatalf("adopt: %v, want %v", err, tc.want)
			}
			for _, a := range as {
				if _, err := os.Stat(a.Path); err != nil {
					t.Errorf("a refused adoption removed %s: %v", a.Path, err)
				}
				if s.Has(a.Address) {
					t.Errorf("a refused adoption stored %s", a.Path)
				}
			}
		})
	}
	// Outside staging: refused before anything is read.
	obj := put(t, s, "stored")
	if err := s.AdoptFiles(t.Context(), []Adoption{{Path: s.Path(obj), Address: obj}}); err == nil {
		t.Fatal("an object's own file adopted")
	}
}

// A file the caller hashed (Adoption.Hashed) is adopted at that hash; one
// whose size is not the size hashed, or hashed as another address, is
// refused with the batch, nothing named.
func TestAdoptFilesHashed(t *testing.T) {
	s := mustStore(t)
	content := map[string]string{"a": "a bytes", "b": "b bytes"}
	hashed := func(as []Adoption, size int64) {
		for i := range as {
			as[i].Hashed = &Hashed{Size: size, Address: as[i].Address}
		}
	}
	as := stageAll(t, s, []string{"a"}, content, nil)
	hashed(as, 7)
	if err := s.AdoptFiles(t.Context(), as); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(t.Context(), as[0].Address); err != nil {
		t.Fatal(err)
	}
	for name, spoil := range map[string]func(as []Adoption){
		"another size":    func(as []Adoption) { as[0].Hashed.Size = 6 },
		"another address": func(as []Adoption) { as[0].Hashed.Address = record.Sum([]byte("other")) },
	} {
		as := stageAll(t, s, []string{"b"}, content, nil)
		hashed(as, 7)
		spoil(as)
		if err := s.AdoptFiles(t.Context(), as); err == nil {
			t.Fatalf("%s: adopted", name)
		}
		if _, err := os.Stat(as[0].Path); err != nil || s.Has(as[0].Address) {
			t.Fatalf("%s: a refused adoption named %s (%v)", name, as[0].Path, err)
		}
	}
}

// The durability argument of AdoptFiles, step by step: every file is
// fsynced before any name, the refs are committed before any name, and
// every directory a name went into (or a stored copy is in) is fsynced
// after the last name and before AdoptFiles returns.
func TestAdoptFilesDurableOrder(t *testing.T) {
	s := mustStore(t)
	held := put(t, s, "held")
	var (
		mu    sync.Mutex
		steps [][2]string
	)
	s.observe = func(step, path string) {
		mu.Lock()
		defer mu.Unlock()
		steps = append(steps, [2]string{step, path})
	}
	content := map[string]string{"held": "held"}
	var names []string
	for _, c := range "abcdefghijklmnopqrstuvwxyz" {
		names = append(names, string(c))
		content[string(c)] = "object " + string(c)
	}
	names = append(names, "held", "att")
	content["att"] = "attestation"
	as := stageAll(t, s, names, content, map[string][]record.Address{"att": {record.Sum([]byte("object a")), held}})
	if err := s.AdoptFiles(t.Context(), as); err != nil {
		t.Fatal(err)
	}
	s.observe = nil
	synced := map[string]int{}    // staged path → step index
	dirSynced := map[string]int{} // directory → step index
	renamed := map[string]int{}   // staged path → step index
	var firstRename, refs, lastRename = -1, -1, -1
	for i, st := range steps {
		switch st[0] {
		case "sync":
			synced[st[1]] = i
		case "refs":
			refs = i
		case "rename":
			src, dst, _ := strings.Cut(st[1], " ")
			if _, ok := synced[src]; !ok {
				t.Errorf("%s named before its bytes were fsynced", dst)
			}
			renamed[src] = i
			if firstRename < 0 {
				firstRename = i
			}
			lastRename = i
		case "syncdir":
			dirSynced[st[1]] = i
		}
	}
	if refs < 0 || refs > firstRename {
		t.Errorf("refs committed at step %d, the first name at %d", refs, firstRename)
	}
	for _, a := range as {
		p := a.Path
		if _, ok := synced[p]; !ok {
			t.Errorf("%s never fsynced", p)
		}
		_, isNew := renamed[p]
		if !isNew && a.Address != held {
			t.Errorf("%s never named", p)
		}
		dir := filepath.Dir(s.Path(a.Address))
		if i, ok := dirSynced[dir]; !ok || i < lastRename {
			t.Errorf("directory %s of %s fsynced at step %d (%v), the last name at %d", dir, a.Address, i, ok, lastRename)
		}
	}
	if len(renamed) != len(as)-1 {
		t.Errorf("%d names for %d new objects", len(renamed), len(as)-1)
	}
}
