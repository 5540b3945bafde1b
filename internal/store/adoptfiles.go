package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Adoption is one staged file for [Store.AdoptFiles]: where it is, the
// address its bytes must hash to, and the refs it declares.
type Adoption struct {
	Path    string
	Address record.Address
	Refs    []record.Address
	// Hashed, when set, is the caller's word, as for [Store.IngestHashed]:
	// it computed Address in this process from the Hashed.Size bytes it
	// wrote to Path, and nothing writes the file any more. The file is
	// then not read again; only its size is checked.
	Hashed *Hashed
}

// syncWorkers is how many fsyncs AdoptFiles has in flight at once. An
// fsync waits on the disk, not the processor; the filesystem's journal
// commits concurrent ones together.
const syncWorkers = 16

// AdoptFiles is [Store.Adopt] for many staged files, made durable
// together rather than one by one. Each file must be below a directory
// from [Store.StagingDir], and each of its refs must be stored or adopted
// before it in as. Its steps, in the order that keeps a crash or a
// refusal harmless:
//
//  1. Each file is hashed (it must hash to its Address: a
//     [*CorruptError] otherwise; one the caller hashed, Adoption.Hashed,
//     must have the size hashed), made read-only and given the time now
//     (a GC grace period from its naming), the files in parallel. A
//     refusal names nothing, and leaves every file staged.
//  2. With collections held off from here to the end, the files are
//     fsynced (in parallel) while the refs of every object are recorded,
//     in one commit: an object that exists always has its refs recorded.
//  3. Each file is renamed into place, in the order of as; an object
//     stored already keeps its stored copy (its time refreshed) and the
//     staged one is removed.
//  4. Every directory a name went into, or an already stored object is
//     in, is fsynced — in parallel.
//
// So when AdoptFiles returns every object of as is durable: each name
// came after its bytes were on disk (1 before 3), and is itself on disk
// (4). A record a caller stores afterwards, which names these objects,
// is never left naming an object a power loss took back. A crash before
// it returns may lose names from step 3 but never shows a name over
// bytes that are not there; the staging directories left are removed at
// the next [Open], and refs recorded for an object that did not appear
// are dropped by the next [Store.GC].
func (s *Store) AdoptFiles(ctx context.Context, as []Adoption) error {
	if len(as) == 0 {
		return nil
	}
	paths := make([]string, len(as))
	for i, a := range as {
		p, err := s.staged(a.Path)
		if err != nil {
			return fmt.Errorf("store: adopt %s: %w", a.Path, err)
		}
		paths[i] = p
	}
	now := time.Now()
	err := parallel(ctx, len(as), func(i int) error {
		return prepare(ctx, paths[i], as[i], now)
	})
	if err != nil {
		return err
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	if err := s.refsBefore(as); err != nil {
		return err
	}
	// The refs' commit and the files' fsyncs at once: each must be done
	// before any name, and neither needs the other.
	refs := make(chan error, 1)
	go func() { refs <- s.addRefsAll(as) }()
	err = parallelN(ctx, len(as), syncWorkers, func(i int) error {
		if err := syncFile(paths[i]); err != nil {
			return fmt.Errorf("store: fsync object %s: %w", as[i].Address, err)
		}
		s.note("sync", paths[i])
		return nil
	})
	if rerr := <-refs; err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	dirs, err := s.place(as, paths, now)
	if err != nil {
		return err
	}
	return parallelN(ctx, len(dirs), syncWorkers, func(i int) error {
		if err := syncDir(dirs[i]); err != nil {
			return err
		}
		s.note("syncdir", dirs[i])
		return nil
	})
}

// prepare hashes the staged file at p, which must hash to ad.Address
// (or, hashed by the caller, have the size hashed), makes it read-only
// and gives it the time now.
func prepare(ctx context.Context, p string, ad Adoption, now time.Time) error {
	a := ad.Address
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("store: adopt: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("store: adopt: %w", err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("store: adopt %s: not a regular file", p)
	}
	switch {
	case ad.Hashed != nil && ad.Hashed.Address != a:
		return fmt.Errorf("store: adopt %s: hashed as %s, adopted as %s", p, ad.Hashed.Address, a)
	case ad.Hashed != nil && info.Size() != ad.Hashed.Size:
		return fmt.Errorf("store: adopt %s: %d bytes, %d were hashed", p, info.Size(), ad.Hashed.Size)
	case ad.Hashed == nil:
		h := blake3.New(32, nil)
		if _, err := copyBuffered(ctx, h, f, info.Size()); err != nil {
			return fmt.Errorf("store: adopt %s: %w", p, err)
		}
		var got record.Address
		h.Sum(got[:0])
		if got != a {
			return fmt.Errorf("store: adopt: %w", &CorruptError{Address: a, Got: got, Path: p})
		}
	}
	if err := f.Chmod(0o400); err != nil {
		return fmt.Errorf("store: adopt: %w", err)
	}
	if err := os.Chtimes(p, now, now); err != nil {
		return fmt.Errorf("store: adopt: %w", err)
	}
	return nil
}

// syncFile fsyncs the file at p. (A descriptor opened to read is enough:
// fsync writes back the file, whatever the descriptor.)
func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// refsBefore checks, with s.gc held, that every ref of as is stored or
// adopted before the object that declares it.
func (s *Store) refsBefore(as []Adoption) error {
	earlier := make(map[record.Address]bool, len(as))
	for _, a := range as {
		for _, r := range a.Refs {
			if !earlier[r] && !s.Has(r) {
				return fmt.Errorf("store: object %s refers to a missing object: %w: %s", a.Address, ErrMissingObject, r)
			}
		}
		earlier[a.Address] = true
	}
	return nil
}

// addRefsAll records the refs of every object of as, each as the union
// with what it declared, in one commit, made only if that adds something.
func (s *Store) addRefsAll(as []Adoption) error {
	add := map[record.Address][]record.Address{}
	for _, a := range as {
		if len(a.Refs) > 0 {
			add[a.Address] = appendNew(add[a.Address], a.Refs)
		}
	}
	if len(add) == 0 {
		return nil
	}
	changed := map[record.Address][]record.Address{}
	err := s.view(func(tx *bolt.Tx) error {
		for a, refs := range add {
			old, err := getRefs(tx, a)
			if err != nil {
				return err
			}
			if merged := appendNew(old, refs); len(merged) > len(old) {
				changed[a] = merged
			}
		}
		return nil
	})
	if err != nil || len(changed) == 0 {
		return err
	}
	s.note("refs", "")
	return s.commit(func(tx *bolt.Tx) error {
		for a, refs := range changed {
			// Read again in the commit: another put may have added
			// refs since the view.
			old, err := getRefs(tx, a)
			if err != nil {
				return err
			}
			merged := appendNew(old, refs)
			v := make([]byte, 0, 32*len(merged))
			for _, r := range merged {
				v = append(v, r[:]...)
			}
			if err := tx.Bucket(bktRefs).Put(a[:], v); err != nil {
				return err
			}
		}
		return nil
	})
}

// place is AdoptFiles' step 3: it renames each staged file into place,
// or drops it for the stored copy (whose time it refreshes), and returns
// the directories to fsync.
func (s *Store) place(as []Adoption, paths []string, now time.Time) ([]string, error) {
	seen := map[string]bool{}
	var dirs []string
	for i, a := range as {
		dst := s.Path(a.Address)
		if d := filepath.Dir(dst); !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
		if s.Has(a.Address) {
			// The stored copy's writer may still be between its rename
			// and its directory's fsync: the directory is fsynced anyway.
			if err := os.Chtimes(dst, now, now); err != nil {
				return nil, fmt.Errorf("store: object %s: %w", a.Address, err)
			}
			if err := os.Remove(paths[i]); err != nil {
				return nil, fmt.Errorf("store: adopt: %w", err)
			}
			continue
		}
		if err := os.Rename(paths[i], dst); err != nil {
			if errors.Is(err, syscall.EXDEV) {
				err = errors.New("staging is on another filesystem than the store: use StagingDir")
			}
			return nil, fmt.Errorf("store: object %s: %w", a.Address, err)
		}
		s.note("rename", paths[i]+" "+dst)
	}
	return dirs, nil
}

// note tells s.observe a durability step, if a test set it.
func (s *Store) note(step, path string) {
	if s.observe != nil {
		s.observe(step, path)
	}
}
