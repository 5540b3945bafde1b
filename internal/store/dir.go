package store

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Listing returns a directory object's entries, verified against its
// address and decoded strictly.
func (s *Store) Listing(dir record.Address) ([]Entry, error) {
	b, err := s.ReadAll(dir)
	if err != nil {
		return nil, err
	}
	es, err := DecodeListing(b)
	if err != nil {
		return nil, fmt.Errorf("directory %s: %w", dir, err)
	}
	return es, nil
}

// VerifyDir verifies a directory object's listing and every file in it.
// An error names the directory and the file.
func (s *Store) VerifyDir(ctx context.Context, dir record.Address) error {
	entries, err := s.Listing(dir)
	if err != nil {
		return err
	}
	return parallel(ctx, len(entries), func(i int) error { return s.verifyEntry(ctx, dir, entries[i]) })
}

func (s *Store) verifyEntry(ctx context.Context, dir record.Address, e Entry) error {
	if err := s.Verify(ctx, e.Address); err != nil {
		return fmt.Errorf("directory %s, file %s: %w", dir, e.Name, err)
	}
	if sz, _ := s.Size(e.Address); uint64(sz) != e.Size {
		return fmt.Errorf("directory %s, file %s: %w: listed size %d, object has %d", dir, e.Name, ErrCorrupt, e.Size, sz)
	}
	return nil
}

// Layout is how [Store.Materialize] lays files out.
type Layout uint8

const (
	// LinkFiles hard-links every file to its stored object: no bytes
	// move, but the files share the objects' read-only inodes, so this is
	// for readers only (CRIU restore reads its images).
	LinkFiles Layout = iota
	// CopyFiles writes private copies with the listed modes, verifying
	// while copying: for trees that will be written to.
	CopyFiles
)

// Materialize lays directory object dir out as the new directory dst,
// verifying every file against its address first (resume is a trust
// boundary; [LinkRehashed] is for files just rehashed). On error dst is
// removed. Copies are not fsynced: dst is a scratch tree that the store
// can always rebuild.
func (s *Store) Materialize(ctx context.Context, dir record.Address, dst string, how Layout) error {
	return s.MaterializeWhere(ctx, dir, dst, how, nil)
}

// MaterializeWhere is [Store.Materialize] of only the entries keep keeps
// (all of them when keep is nil).
func (s *Store) MaterializeWhere(ctx context.Context, dir record.Address, dst string, how Layout, keep func(Entry) bool) error {
	entries, err := s.Listing(dir)
	if err != nil {
		return err
	}
	if keep != nil {
		kept := entries[:0]
		for _, e := range entries {
			if keep(e) {
				kept = append(kept, e)
			}
		}
		entries = kept
	}
	return s.MaterializeListed(ctx, dir, entries, dst, how)
}

// MaterializeListed is [Store.Materialize] of entries of dir's listing
// that the caller has read already ([Store.Listing], [Store.RehashListing]).
func (s *Store) MaterializeListed(ctx context.Context, dir record.Address, entries []Entry, dst string, how Layout) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("store: materialize %s: %w", dir, err)
	}
	for _, e := range entries {
		if d := path.Dir(e.Name); d != "." {
			if err := os.MkdirAll(filepath.Join(dst, filepath.FromSlash(d)), 0o700); err != nil {
				os.RemoveAll(dst)
				return fmt.Errorf("store: materialize %s: %w", dir, err)
			}
		}
	}
	err := parallel(ctx, len(entries), func(i int) error {
		e := entries[i]
		p := filepath.Join(dst, filepath.FromSlash(e.Name))
		if how == CopyFiles {
			return s.copyOut(ctx, dir, e, p)
		}
		if how != LinkRehashed {
			if err := s.verifyEntry(ctx, dir, e); err != nil {
				return err
			}
		}
		return os.Link(s.Path(e.Address), p)
	})
	if err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("store: materialize %s: %w", dir, err)
	}
	return nil
}

func (s *Store) copyOut(ctx context.Context, dir record.Address, e Entry, p string) error {
	r, err := s.Open(e.Address)
	if err != nil {
		return fmt.Errorf("directory %s, file %s: %w", dir, e.Name, err)
	}
	defer r.Close()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fs.FileMode(e.Mode))
	if err != nil {
		return err
	}
	n, err := r.writeTo(ctx, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && uint64(n) != e.Size {
		err = fmt.Errorf("%w: listed size %d, object has %d", ErrCorrupt, e.Size, n)
	}
	if err == nil {
		err = os.Chmod(p, fs.FileMode(e.Mode)) // past the umask
	}
	if err != nil {
		return fmt.Errorf("directory %s, file %s: %w", dir, e.Name, err)
	}
	return nil
}
