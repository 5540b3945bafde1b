package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// StagingDir returns a new, empty directory on the store's filesystem for
// a producer (CRIU, say) to write a tree into before [Store.Ingest].
// Staging directories a crash leaves behind are removed when the store
// next opens.
func (s *Store) StagingDir(prefix string) (string, error) {
	d, err := os.MkdirTemp(filepath.Join(s.objects, "tmp"), prefix+"-*")
	if err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	return d, nil
}

// IngestStats describes an [Store.Ingest] or [Store.IngestHashed].
type IngestStats struct {
	Files int   // regular files in the tree
	Bytes int64 // their total size
	New   int   // files not already in the store (the rest were dropped)
	// NewBytes is the bytes of the New files: what the ingest added to
	// the store, besides the listing.
	NewBytes int64
}

// Ingest turns a staged tree into a directory object and returns its
// address. Every regular file is hashed (in parallel, streaming), made
// durable, and renamed into the store — never copied — so staging must be
// on the store's filesystem: use [Store.StagingDir]. A file whose bytes
// are already stored is dropped from staging. Symbolic links, devices and
// empty directories have no place in a listing and are refused rather
// than lost; a tree a listing cannot hold (a name or file count over the
// limits) is refused with [ErrListing] before a byte is hashed. On success
// the staging directory is gone.
func (s *Store) Ingest(ctx context.Context, staging string) (record.Address, IngestStats, error) {
	return s.ingest(ctx, staging, nil, nil)
}

// ingest is [Store.Ingest], taking the addresses of the files in known
// from the caller instead of hashing them ([Store.IngestHashed]), and
// listing besides the staged files the entries of stored, objects the
// store holds already ([Store.IngestChunks]). Its
// steps come in the order that keeps a crash or a refusal harmless: the
// tree is judged before a byte is hashed, every file is hashed and made
// durable before any is named, every file is named before the listing
// that names them, and staging is removed last.
func (s *Store) ingest(ctx context.Context, staging string, known map[string]Hashed, stored []Entry) (record.Address, IngestStats, error) {
	files, err := stagedFiles(staging, known, stored)
	if err != nil {
		return record.Address{}, IngestStats{}, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	entries, err := hashTree(ctx, staging, files, known)
	if err != nil {
		return record.Address{}, IngestStats{}, err
	}
	listing, err := EncodeListing(slices.Concat(entries, stored))
	if err != nil {
		return record.Address{}, IngestStats{}, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	p, err := s.write(ctx, bytes.NewReader(listing))
	if err != nil {
		return record.Address{}, IngestStats{}, err
	}
	defer p.discard()
	// From the first rename until the listing names the files, no
	// collection may run: the files are named by nothing in between.
	s.gc.RLock()
	defer s.gc.RUnlock()
	// The objects listed without a staged copy are checked before a file
	// is named: a refused ingest names nothing.
	var st IngestStats
	held, err := s.keepStored(stored, entries, &st)
	if err != nil {
		return record.Address{}, st, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	st, refs, err := s.placeFiles(staging, files, entries, st)
	if err != nil {
		return record.Address{}, st, err
	}
	refs = append(refs, held...)
	// And one more syncfs for the names.
	if err := syncFS(s.objects); err != nil {
		return record.Address{}, st, err
	}
	if err := s.commitObject(p, appendNew(nil, refs)); err != nil {
		return record.Address{}, st, err
	}
	if err := os.RemoveAll(staging); err != nil {
		return record.Address{}, st, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	return p.addr, st, nil
}

// stagedFiles lists the regular files of the staged tree and refuses it,
// before a byte is hashed, if a listing cannot hold it: a symbolic link,
// device or empty directory (which a listing would lose), a file known
// names that is not staged, or a name or file count over a listing's
// limits. It comes first so that a refused tree costs no hashing.
func stagedFiles(staging string, known map[string]Hashed, stored []Entry) ([]string, error) {
	files, err := walkStaged(staging)
	if err != nil {
		return nil, err
	}
	if err := knownStaged(staging, files, known); err != nil {
		return nil, err
	}
	if err := checkTree(staging, files, stored); err != nil {
		return nil, err
	}
	return files, nil
}

// walkStaged returns the paths of the staged tree's regular files, in
// lexical order, refusing anything else a listing cannot hold (see
// [Store.Ingest]) and more files than [MaxEntries].
func walkStaged(staging string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(staging, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.Type().IsRegular():
			if len(files) == MaxEntries {
				return fmt.Errorf("%w: more than %d files", ErrListing, MaxEntries)
			}
			files = append(files, p)
		case d.IsDir() && p != staging:
			empty, err := isEmptyDir(p)
			if err != nil {
				return err
			}
			if empty {
				return fmt.Errorf("%s is an empty directory", p)
			}
		case d.IsDir():
		default:
			return fmt.Errorf("%s is a %s, not a regular file", p, d.Type())
		}
		return nil
	})
	return files, err
}

// hashTree hashes every staged file (or takes its address from known),
// one worker per processor, and makes the tree durable while it does.
// It comes before any file is renamed into the store: a name must never
// appear over bytes that a power loss could take back (a present object
// is trusted). A refusal from the hashing is wrapped with the staging
// directory; one from the syncfs already names what failed.
func hashTree(ctx context.Context, staging string, files []string, known map[string]Hashed) ([]Entry, error) {
	// The producer did not fsync. One syncfs writes back the whole tree:
	// an fsync per file costs a device flush each, which for a CRIU tree
	// of thousands of small files was more than hashing a gigabyte. It
	// runs while the files are hashed: the producer is done, so what it
	// writes back is what is hashed, and the renames after this wait for
	// both.
	synced := make(chan error, 1)
	go func() { synced <- syncFS(staging) }()
	entries := make([]Entry, len(files))
	err := parallel(ctx, len(files), func(i int) (err error) {
		entries[i], err = hashStaged(ctx, staging, files[i], known)
		return err
	})
	if serr := <-synced; err == nil && serr != nil {
		return nil, serr
	}
	if err != nil {
		return nil, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	return entries, nil
}

// placeFiles renames each hashed file into the store as its object, or,
// when the object is already stored, refreshes the stored one's time (a
// GC grace period from now) and drops the staged file. It runs with
// s.gc held, after [hashTree] made the bytes durable and before the
// listing that names them is committed. It returns the tree's stats and
// the files' addresses, the listing's refs; on error, the stats so far.
// It adds to st.
func (s *Store) placeFiles(staging string, files []string, entries []Entry, st IngestStats) (IngestStats, []record.Address, error) {
	st.Files += len(files)
	refs := make([]record.Address, 0, len(entries))
	now := time.Now()
	for i, e := range entries {
		st.Bytes += int64(e.Size)
		refs = append(refs, e.Address)
		dst := s.Path(e.Address)
		if s.Has(e.Address) {
			if err := os.Chtimes(dst, now, now); err != nil {
				return st, nil, fmt.Errorf("store: ingest %s: %w", staging, err)
			}
			os.Remove(files[i]) // staging is removed after the listing in any case
			continue
		}
		if err := os.Rename(files[i], dst); err != nil {
			if errors.Is(err, syscall.EXDEV) {
				err = errors.New("staging is on another filesystem than the store: use StagingDir")
			}
			return st, nil, fmt.Errorf("store: ingest %s: %w", staging, err)
		}
		st.New++
		st.NewBytes += int64(e.Size)
	}
	return st, refs, nil
}

// checkTree refuses, before a byte is hashed, a tree whose listing would
// break a listing's name rules or limits.
func checkTree(staging string, files []string, stored []Entry) error {
	es := make([]Entry, len(files), len(files)+len(stored))
	for i, p := range files {
		rel, err := filepath.Rel(staging, p)
		if err != nil {
			return err
		}
		es[i].Name = filepath.ToSlash(rel)
		if err := checkName(es[i].Name); err != nil {
			return fmt.Errorf("%w: entry %q: %v", ErrListing, es[i].Name, err)
		}
	}
	for _, e := range stored {
		if err := checkName(e.Name); err != nil {
			return fmt.Errorf("%w: entry %q: %v", ErrListing, e.Name, err)
		}
		es = append(es, e)
	}
	_, err := listingSize(es)
	return err
}

func isEmptyDir(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	switch _, err := f.Readdirnames(1); err {
	case nil:
		return false, nil
	case io.EOF:
		return true, nil
	default:
		return false, err
	}
}

// hashStaged hashes one staged file, or takes its address from known,
// and makes it read-only.
func hashStaged(ctx context.Context, root, p string, known map[string]Hashed) (Entry, error) {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return Entry{}, err
	}
	name := filepath.ToSlash(rel)
	f, err := os.Open(p)
	if err != nil {
		return Entry{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Name: name, Mode: uint32(info.Mode().Perm())}
	if k, ok := known[name]; ok {
		if info.Size() != k.Size {
			return Entry{}, fmt.Errorf("%s: %d bytes, hashed when it had %d", p, info.Size(), k.Size)
		}
		e.Size, e.Address = uint64(k.Size), k.Address
	} else {
		h := blake3.New(32, nil)
		n, err := copyBuffered(ctx, h, f, info.Size())
		if err != nil {
			return Entry{}, fmt.Errorf("hashing %s: %w", p, err)
		}
		e.Size = uint64(n)
		h.Sum(e.Address[:0])
	}
	if err := f.Chmod(0o400); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// syncFS commits everything dirty on the filesystem holding path.
func syncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("store: syncfs %s: %w", path, err)
	}
	return nil
}
