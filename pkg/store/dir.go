package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// DirDomain starts every directory listing's canonical bytes.
const DirDomain = "runrecordd.dir/1"

// Entry is one file of a directory object.
type Entry struct {
	Name    string // path relative to the directory, '/'-separated, clean
	Mode    uint32 // permission bits (fs.FileMode.Perm)
	Size    uint64
	Address record.Address
}

// entryMin is the fewest bytes one entry takes in a listing.
const entryMin = 4 + 1 + 4 + 8 + 32

// A listing's limits, held by [EncodeListing], [DecodeListing] and so
// [Store.Ingest] alike (docs/store.md, "Directory objects").
const (
	// MaxNameBytes is the longest name: Linux's PATH_MAX (4096) less its
	// terminating NUL. No longer path can be opened on Linux.
	MaxNameBytes = 4095
	// MaxComponentBytes is the longest component of a name: Linux's
	// NAME_MAX.
	MaxComponentBytes = 255
	// MaxEntries is the most entries one listing holds: a CRIU image
	// directory of the most processes a bundle may ask for (16384), about
	// a dozen files each, takes about a fifth of it.
	MaxEntries = 1 << 20
	// MaxListingBytes is the largest listing. A listing is read whole, and
	// this is the default limit of a document a bundle importer decodes
	// (bundle.DefaultLimits.JSON), so every listing a store writes travels
	// in a bundle.
	MaxListingBytes = 64 << 20
)

// ErrListing is a directory listing whose entries break its rules: a name
// that is not a clean relative path or is over a name limit, a mode beyond
// the permission bits, a name twice, a file that is another's directory,
// or more entries or bytes than a listing may hold. [EncodeListing] and
// [Store.Ingest] refuse with it; [DecodeListing] with it and [ErrCorrupt].
var ErrListing = errors.New("directory listing refused")

// EncodeListing returns a directory's canonical listing: [DirDomain], the
// entry count (4 bytes), then the entries in byte order of name, each a
// 4-byte name length, the name, the mode (4), the size (8) and the file's
// address (32); integers big-endian. The directory object's address is the
// BLAKE3 of these bytes. Names must be clean relative paths within the name
// limits, unique, and no name may be both a file and another's directory;
// a refusal wraps [ErrListing].
func EncodeListing(entries []Entry) ([]byte, error) {
	size, err := listingSize(entries)
	if err != nil {
		return nil, err
	}
	es := slices.Clone(entries)
	slices.SortFunc(es, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	if err := checkEntries(es); err != nil {
		return nil, err
	}
	b := make([]byte, 0, size)
	b = append(b, DirDomain...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(es)))
	for _, e := range es {
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Name)))
		b = append(b, e.Name...)
		b = binary.BigEndian.AppendUint32(b, e.Mode)
		b = binary.BigEndian.AppendUint64(b, e.Size)
		b = append(b, e.Address[:]...)
	}
	return b, nil
}

// listingSize returns the bytes of the listing of es, refusing more
// entries or bytes than a listing may hold.
func listingSize(es []Entry) (int, error) {
	if len(es) > MaxEntries {
		return 0, fmt.Errorf("%w: %d entries, the limit is %d", ErrListing, len(es), MaxEntries)
	}
	n := len(DirDomain) + 4
	for _, e := range es {
		n += entryMin - 1 + len(e.Name)
	}
	if n > MaxListingBytes {
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrListing, n, MaxListingBytes)
	}
	return n, nil
}

// checkEntries checks sorted entries: names clean and within the limits,
// strictly increasing, modes within the permission bits, no file that is
// also a directory.
func checkEntries(es []Entry) error {
	files := make(map[string]bool, len(es))
	for i, e := range es {
		if err := checkName(e.Name); err != nil {
			return fmt.Errorf("%w: entry %q: %v", ErrListing, e.Name, err)
		}
		if e.Mode&^uint32(fs.ModePerm) != 0 {
			return fmt.Errorf("%w: entry %q: mode %o beyond permission bits", ErrListing, e.Name, e.Mode)
		}
		if i > 0 && es[i-1].Name >= e.Name {
			return fmt.Errorf("%w: entry %q: duplicate or out of order", ErrListing, e.Name)
		}
		files[e.Name] = true
	}
	for _, e := range es {
		for d := path.Dir(e.Name); d != "."; d = path.Dir(d) {
			if files[d] {
				return fmt.Errorf("%w: entry %q: its directory %q is a file", ErrListing, e.Name, d)
			}
		}
	}
	return nil
}

// checkName refuses a name that is not a clean relative path — empty, ".",
// "..", absolute, with an empty, "." or ".." component, a trailing '/' —
// that holds a NUL, or that is over [MaxNameBytes] or has a component
// over [MaxComponentBytes]. Any other byte is allowed: names are bytes, as
// Linux's are, not necessarily UTF-8.
func checkName(n string) error {
	if len(n) > MaxNameBytes {
		return fmt.Errorf("a name of %d bytes, the limit is %d", len(n), MaxNameBytes)
	}
	if n == "" || n == "." || n == ".." || strings.HasPrefix(n, "/") || strings.HasPrefix(n, "../") ||
		path.Clean(n) != n || strings.IndexByte(n, 0) >= 0 {
		return errors.New("not a clean relative path")
	}
	for c := range strings.SplitSeq(n, "/") {
		if len(c) > MaxComponentBytes {
			return fmt.Errorf("a component of %d bytes, the limit is %d", len(c), MaxComponentBytes)
		}
	}
	return nil
}

// DecodeListing parses a canonical listing. It accepts only the bytes
// [EncodeListing] writes; anything else is [ErrCorrupt], and entries that
// break a listing's rules or limits are [ErrListing] too. A count or size
// over the limits is refused before anything is allocated for it.
func DecodeListing(b []byte) ([]Entry, error) {
	bad := func(format string, args ...any) ([]Entry, error) {
		return nil, fmt.Errorf("%w: directory listing: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) > MaxListingBytes {
		return nil, fmt.Errorf("%w: %w: %d bytes, the limit is %d", ErrCorrupt, ErrListing, len(b), MaxListingBytes)
	}
	if len(b) < len(DirDomain)+4 || !bytes.HasPrefix(b, []byte(DirDomain)) {
		return bad("no %q header", DirDomain)
	}
	p := b[len(DirDomain):]
	n := binary.BigEndian.Uint32(p)
	p = p[4:]
	if n > MaxEntries {
		return nil, fmt.Errorf("%w: %w: %d entries, the limit is %d", ErrCorrupt, ErrListing, n, MaxEntries)
	}
	if uint64(n) > uint64(len(p))/entryMin {
		return bad("%d entries in %d bytes", n, len(p))
	}
	out := make([]Entry, 0, n)
	for range n {
		if len(p) < 4 {
			return bad("truncated")
		}
		l := uint64(binary.BigEndian.Uint32(p))
		if l > MaxNameBytes {
			return nil, fmt.Errorf("%w: %w: a name of %d bytes, the limit is %d", ErrCorrupt, ErrListing, l, MaxNameBytes)
		}
		if uint64(len(p)) < 4+l+44 {
			return bad("truncated")
		}
		e := Entry{Name: string(p[4 : 4+l])}
		p = p[4+l:]
		e.Mode = binary.BigEndian.Uint32(p)
		e.Size = binary.BigEndian.Uint64(p[4:])
		copy(e.Address[:], p[12:44])
		p = p[44:]
		out = append(out, e)
	}
	if len(p) != 0 {
		return bad("%d trailing bytes", len(p))
	}
	if err := checkEntries(out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return out, nil
}

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
	return s.ingest(ctx, staging, nil)
}

// ingest is [Store.Ingest], taking the addresses of the files in known
// from the caller instead of hashing them ([Store.IngestHashed]).
func (s *Store) ingest(ctx context.Context, staging string, known map[string]Hashed) (record.Address, IngestStats, error) {
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
	if err != nil {
		return record.Address{}, IngestStats{}, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	if err := knownStaged(staging, files, known); err != nil {
		return record.Address{}, IngestStats{}, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	if err := checkTree(staging, files); err != nil {
		return record.Address{}, IngestStats{}, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	// The producer did not fsync, and a name must never appear over bytes
	// that a power loss could take back (a present object is trusted). One
	// syncfs writes back the whole tree: an fsync per file costs a device
	// flush each, which for a CRIU tree of thousands of small files was
	// more than hashing a gigabyte. It runs while the files are hashed:
	// the producer is done, so what it writes back is what is hashed, and
	// the renames below wait for both.
	synced := make(chan error, 1)
	go func() { synced <- syncFS(staging) }()
	entries := make([]Entry, len(files))
	err = parallel(ctx, len(files), func(i int) (err error) {
		entries[i], err = hashStaged(ctx, staging, files[i], known)
		return err
	})
	if serr := <-synced; err == nil && serr != nil {
		return record.Address{}, IngestStats{}, serr
	}
	if err != nil {
		return record.Address{}, IngestStats{}, fmt.Errorf("store: ingest %s: %w", staging, err)
	}
	listing, err := EncodeListing(entries)
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
	st := IngestStats{Files: len(files)}
	refs := make([]record.Address, 0, len(entries))
	now := time.Now()
	for i, e := range entries {
		st.Bytes += int64(e.Size)
		refs = append(refs, e.Address)
		dst := s.Path(e.Address)
		if s.Has(e.Address) {
			if err := os.Chtimes(dst, now, now); err != nil {
				return record.Address{}, st, fmt.Errorf("store: ingest %s: %w", staging, err)
			}
			os.Remove(files[i]) // staging is removed below in any case
			continue
		}
		if err := os.Rename(files[i], dst); err != nil {
			if errors.Is(err, syscall.EXDEV) {
				err = errors.New("staging is on another filesystem than the store: use StagingDir")
			}
			return record.Address{}, st, fmt.Errorf("store: ingest %s: %w", staging, err)
		}
		st.New++
	}
	// And one more for the names.
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

// checkTree refuses, before a byte is hashed, a tree whose listing would
// break a listing's name rules or limits.
func checkTree(staging string, files []string) error {
	es := make([]Entry, len(files))
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

// parallel runs fn(0) … fn(n-1) on one worker per processor and returns
// the first error; after an error no new calls start.
func parallel(ctx context.Context, n int, fn func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

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
	entries, err := s.Listing(dir)
	if err != nil {
		return err
	}
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
	err = parallel(ctx, len(entries), func(i int) error {
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
