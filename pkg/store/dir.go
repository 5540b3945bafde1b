package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// DirDomain starts a directory listing's canonical bytes.
const DirDomain = "runrecordd.dir/1"

// Entry is one file of a directory object.
type Entry struct {
	Name    string // slash-separated path relative to the directory
	Mode    uint32 // permission bits
	Size    uint64
	Address record.Address
}

// EncodeListing returns a directory's canonical listing: the domain, a
// 4-byte count, then the entries sorted by name, each a 4-byte name length,
// the name, the mode (4), the size (8) and the file's address (32). The
// directory object's address is the BLAKE3 of these bytes.
func EncodeListing(entries []Entry) []byte {
	es := append([]Entry(nil), entries...)
	sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
	b := make([]byte, 0, len(DirDomain)+4+len(es)*64)
	b = append(b, DirDomain...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(es)))
	for _, e := range es {
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Name)))
		b = append(b, e.Name...)
		b = binary.BigEndian.AppendUint32(b, e.Mode)
		b = binary.BigEndian.AppendUint64(b, e.Size)
		b = append(b, e.Address[:]...)
	}
	return b
}

// DecodeListing parses a canonical listing, accepting only what
// EncodeListing writes (sorted, unique, clean relative names).
func DecodeListing(b []byte) ([]Entry, error) {
	bad := func(why string) ([]Entry, error) {
		return nil, fmt.Errorf("%w: directory listing: %s", ErrCorrupt, why)
	}
	if !bytes.HasPrefix(b, []byte(DirDomain)) || len(b) < len(DirDomain)+4 {
		return bad("no header")
	}
	p := b[len(DirDomain):]
	n := binary.BigEndian.Uint32(p)
	p = p[4:]
	if uint64(n) > uint64(len(p))/48 {
		return bad("count too large")
	}
	out := make([]Entry, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(p) < 4 {
			return bad("truncated")
		}
		l := binary.BigEndian.Uint32(p)
		if uint64(len(p)) < 4+uint64(l)+44 {
			return bad("truncated")
		}
		e := Entry{Name: string(p[4 : 4+l])}
		p = p[4+l:]
		e.Mode = binary.BigEndian.Uint32(p)
		e.Size = binary.BigEndian.Uint64(p[4:])
		copy(e.Address[:], p[12:44])
		p = p[44:]
		if !validName(e.Name) || (i > 0 && e.Name <= out[i-1].Name) {
			return bad(fmt.Sprintf("name %q out of order or unclean", e.Name))
		}
		out = append(out, e)
	}
	if len(p) != 0 {
		return bad("trailing bytes")
	}
	return out, nil
}

func validName(n string) bool {
	return n != "" && !strings.HasPrefix(n, "/") && path.Clean(n) == n && n != ".." && !strings.HasPrefix(n, "../")
}

// StagingDir returns a new empty directory on the store's filesystem, for
// a producer (CRIU, a layer export) to write into before [Store.Ingest].
// Staging directories left by a crash are removed when the store opens.
func (s *Store) StagingDir(prefix string) (string, error) {
	d, err := os.MkdirTemp(filepath.Join(s.objects, "tmp"), prefix+"-*")
	if err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	return d, nil
}

// IngestStats describes an ingest.
type IngestStats struct {
	Files int
	Bytes int64
	New   int // files that were not already in the store
}

// Ingest turns a staging directory into a directory object and returns its
// address. Each regular file is hashed, fsynced and renamed into the store
// — never copied — so staging must be on the store's filesystem (use
// [Store.StagingDir]). Files already stored are dropped from staging.
// Symbolic links and special files are refused. The staging directory is
// removed on success.
func (s *Store) Ingest(staging string) (record.Address, IngestStats, error) {
	var files []string
	err := filepath.WalkDir(staging, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return nil
		case d.Type().IsRegular():
			files = append(files, p)
			return nil
		}
		return fmt.Errorf("store: ingest %s: %s is not a regular file", staging, p)
	})
	if err != nil {
		return record.Address{}, IngestStats{}, err
	}
	entries := make([]Entry, len(files))
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				entries[i], errs[i] = hashFile(staging, files[i])
			}
		}()
	}
	for i := range files {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return record.Address{}, IngestStats{}, err
	}
	// The producer (CRIU) does not fsync, and an object must be durable
	// before a segment can name it. One syncfs writes back every staged
	// file at once: per-file fsync costs a device flush each, which for a
	// CRIU tree of thousands of small files dominated the ingest.
	if err := syncFS(staging); err != nil {
		return record.Address{}, IngestStats{}, err
	}
	st := IngestStats{Files: len(files)}
	refs := make([]record.Address, 0, len(entries))
	for i, e := range entries {
		st.Bytes += int64(e.Size)
		refs = append(refs, e.Address)
		dst := s.Path(e.Address)
		if s.Has(e.Address) {
			os.Remove(files[i])
			continue
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return record.Address{}, st, fmt.Errorf("store: %w", err)
		}
		if err := os.Rename(files[i], dst); err != nil {
			if errors.Is(err, syscall.EXDEV) {
				return record.Address{}, st, fmt.Errorf("store: ingest %s: staging is on another filesystem than the store; use StagingDir", staging)
			}
			return record.Address{}, st, fmt.Errorf("store: %w", err)
		}
		st.New++
	}
	// And one more for the renames (the directory entries).
	if err := syncFS(s.objects); err != nil {
		return record.Address{}, st, err
	}
	a, err := s.PutBytes(EncodeListing(entries), dedupe(refs)...)
	if err != nil {
		return record.Address{}, st, err
	}
	os.RemoveAll(staging)
	return a, st, nil
}

func dedupe(as []record.Address) []record.Address {
	seen := make(map[record.Address]bool, len(as))
	out := as[:0:0]
	for _, a := range as {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// hashFile hashes one staged file and makes it read-only. Ingest makes it
// durable, with every other file of the tree, in one syncfs.
func hashFile(root, p string) (Entry, error) {
	f, err := os.Open(p)
	if err != nil {
		return Entry{}, fmt.Errorf("store: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Entry{}, fmt.Errorf("store: %w", err)
	}
	h := blake3.New(32, nil)
	bp := bufPool.Get().(*[]byte)
	n, err := copyLarge(h, f, *bp)
	bufPool.Put(bp)
	if err != nil {
		return Entry{}, fmt.Errorf("store: hashing %s: %w", p, err)
	}
	if err := f.Chmod(0o400); err != nil {
		return Entry{}, fmt.Errorf("store: %w", err)
	}
	rel, _ := filepath.Rel(root, p)
	e := Entry{Name: filepath.ToSlash(rel), Mode: uint32(st.Mode().Perm()), Size: uint64(n)}
	h.Sum(e.Address[:0])
	return e, nil
}

// Listing returns a directory object's verified entries.
func (s *Store) Listing(dir record.Address) ([]Entry, error) {
	b, err := s.ReadAll(dir)
	if err != nil {
		return nil, err
	}
	return DecodeListing(b)
}

// VerifyDir verifies a directory object's listing and every file in it.
func (s *Store) VerifyDir(dir record.Address) error {
	entries, err := s.Listing(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := s.Verify(e.Address); err != nil {
			return fmt.Errorf("directory %s, file %s: %w", dir, e.Name, err)
		}
	}
	return nil
}

// Materialize lays a directory object out under dst (which must not exist)
// as hard links to the stored files, after verifying each when verify is
// set. The links share the objects' read-only inodes: readers only.
func (s *Store) Materialize(dir record.Address, dst string, verify bool) error {
	entries, err := s.Listing(dir)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	for _, e := range entries {
		if verify {
			if err := s.Verify(e.Address); err != nil {
				return fmt.Errorf("directory %s, file %s: %w", dir, e.Name, err)
			}
		}
		p := filepath.Join(dst, filepath.FromSlash(e.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return fmt.Errorf("store: %w", err)
		}
		if err := os.Link(s.Path(e.Address), p); err != nil {
			return fmt.Errorf("store: materialize %s: %w", e.Name, err)
		}
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
