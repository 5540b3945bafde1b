package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Adopt makes a file already on the store's filesystem an object, without
// copying it, and returns its address: it hashes the file, then fsyncs it,
// renames it into place and fsyncs the directory, as [Store.Put] does. The
// file must be a regular file inside a directory from [Store.StagingDir],
// and nothing may write to it once Adopt is called. refs are declared as
// for Put. If the object is already stored the staged file is removed; a
// refused adoption leaves it where it was.
func (s *Store) Adopt(ctx context.Context, path string, refs ...record.Address) (record.Address, error) {
	path, err := s.staged(path)
	if err != nil {
		return record.Address{}, fmt.Errorf("store: adopt %s: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return record.Address{}, fmt.Errorf("store: adopt: %w", err)
	}
	p := &pending{f: f}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return record.Address{}, fmt.Errorf("store: adopt: %w", err)
	}
	if !info.Mode().IsRegular() {
		return record.Address{}, fmt.Errorf("store: adopt %s: not a regular file", path)
	}
	h := blake3.New(32, nil)
	if _, err := copyBuffered(ctx, h, f, info.Size()); err != nil {
		return record.Address{}, fmt.Errorf("store: adopt %s: %w", path, err)
	}
	h.Sum(p.addr[:0])
	s.gc.RLock()
	defer s.gc.RUnlock()
	if err := s.commitObject(p, refs); err != nil {
		return record.Address{}, err
	}
	if !p.renamed {
		// Already stored: the staged copy is not needed.
		if err := os.Remove(path); err != nil {
			return record.Address{}, fmt.Errorf("store: adopt: %w", err)
		}
	}
	return p.addr, nil
}

// staged checks that path is a regular file below a staging directory
// (objects/tmp/<dir>/…), and returns it with its directories' links
// resolved: only there is a rename into the store a rename on one
// filesystem, of a file nothing else names.
func (s *Store) staged(path string) (string, error) {
	// Resolve links in the directories, not the file: a link from staging
	// to elsewhere is not staged.
	tmp, err := filepath.EvalSymlinks(filepath.Join(s.objects, "tmp"))
	if err != nil {
		return path, err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return path, err
	}
	abs := filepath.Join(dir, filepath.Base(path))
	rel, err := filepath.Rel(tmp, abs)
	if err != nil || !filepath.IsLocal(rel) || !strings.Contains(rel, string(filepath.Separator)) {
		return path, errors.New("not inside a staging directory: use StagingDir")
	}
	info, err := os.Lstat(abs)
	if err != nil {
		return path, err
	}
	if !info.Mode().IsRegular() {
		return path, fmt.Errorf("a %s, not a regular file", info.Mode().Type())
	}
	return abs, nil
}
