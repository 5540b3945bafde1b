package store

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Path returns the file an object lives in, whether or not it exists:
// objects/<c>/<text>, where <text> is the address's text without "b3:"
// and <c> its first character. Reading the file directly is not verified;
// it is for local hot paths that trust the disk.
func (s *Store) Path(a record.Address) string {
	// One allocation: a resume names every chunk of its image (32,768
	// for 512 MiB), and filepath.Join's allocations and Clean were most
	// of the time its page server's manifest took. s.objects is clean,
	// and the text has no separator.
	var t [pathTextLen]byte
	base64.RawURLEncoding.Encode(t[:], a[:])
	var b strings.Builder
	b.Grow(len(s.objects) + 3 + len(t))
	b.WriteString(s.objects)
	b.WriteByte(filepath.Separator)
	b.WriteByte(t[0])
	b.WriteByte(filepath.Separator)
	b.Write(t[:])
	return b.String()
}

// pathTextLen is the length of an address's text without "b3:": 32
// bytes in unpadded base64url.
const pathTextLen = (32*8 + 5) / 6

// Has reports whether the object is in the store. It does not read it.
func (s *Store) Has(a record.Address) bool {
	info, err := os.Lstat(s.Path(a))
	return err == nil && info.Mode().IsRegular()
}

// Touch marks the objects at as put now, as a put of them again would:
// a collection keeps each for its grace even if no record reaches it.
// It fails with ErrMissingObject at the first one the store lacks
// (those before it are touched); a collection under way ends first.
func (s *Store) Touch(as ...record.Address) error {
	s.gc.RLock()
	defer s.gc.RUnlock()
	now := time.Now()
	for _, a := range as {
		if !s.Has(a) {
			return fmt.Errorf("%w: %s", ErrMissingObject, a)
		}
		if err := os.Chtimes(s.Path(a), now, now); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) haveAll(as []record.Address) error {
	for _, a := range as {
		if !s.Has(a) {
			return fmt.Errorf("%w: %s", ErrMissingObject, a)
		}
	}
	return nil
}

// Size returns an object's size in bytes.
func (s *Store) Size(a record.Address) (int64, error) {
	info, err := os.Stat(s.Path(a))
	if err != nil {
		return 0, notFound(a, err)
	}
	return info.Size(), nil
}

func notFound(a record.Address, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", ErrMissingObject, a)
	}
	return fmt.Errorf("object %s: %w", a, err)
}

// Put streams r into the store and returns its address; the bytes are
// never held whole in memory. refs declares the objects this one refers
// to (an attestation its receipt and replay journal, say): they must be
// in the store already, and they stay reachable as long as this object
// is. The object is durable when Put returns. Putting bytes already
// stored keeps the stored copy and adds refs to its declared refs.
func (s *Store) Put(ctx context.Context, r io.Reader, refs ...record.Address) (record.Address, error) {
	p, err := s.write(ctx, r)
	if err != nil {
		return record.Address{}, err
	}
	defer p.discard()
	s.gc.RLock()
	defer s.gc.RUnlock()
	if err := s.commitObject(p, refs); err != nil {
		return record.Address{}, err
	}
	return p.addr, nil
}

// PutBytes stores b; see [Store.Put].
func (s *Store) PutBytes(b []byte, refs ...record.Address) (record.Address, error) {
	return s.Put(context.Background(), bytes.NewReader(b), refs...)
}

// pending is an object written to objects/tmp and hashed, not yet named.
type pending struct {
	f       *os.File
	addr    record.Address
	renamed bool // into place, by seal
}

// discard closes the file and, unless it was renamed into place, removes it.
func (p *pending) discard() {
	p.f.Close()
	if !p.renamed {
		os.Remove(p.f.Name())
	}
}

// write streams r into a temporary file, hashing it. It holds no lock, so
// a long stream never holds up a collection (or, behind one, appends).
func (s *Store) write(ctx context.Context, r io.Reader) (*pending, error) {
	f, err := os.CreateTemp(filepath.Join(s.objects, "tmp"), "put-*")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	p := &pending{f: f}
	h := blake3.New(32, nil)
	if _, err := copyBuffered(ctx, io.MultiWriter(f, h), r, -1); err != nil {
		p.discard()
		return nil, fmt.Errorf("store: writing object: %w", err)
	}
	h.Sum(p.addr[:0])
	return p, nil
}

// commitObject names a pending object, with s.gc held: its refs must be
// stored, they are recorded first (an object that exists always has its
// refs recorded), and then it is sealed.
func (s *Store) commitObject(p *pending, refs []record.Address) error {
	if err := s.haveAll(refs); err != nil {
		return fmt.Errorf("store: object %s refers to a missing object: %w", p.addr, err)
	}
	if err := s.addRefs(p.addr, refs); err != nil {
		return err
	}
	return s.seal(p)
}

// seal makes p its object, durably: fsync the bytes, rename them into
// place, fsync the directory (internal/atomicfile says why each; here, a
// name over bytes a power loss took back would be trusted, as every
// present object is). The rename is from objects/tmp, where the bytes
// were written before their address was known, so this is atomicfile's
// sequence but not its Write. If the object is already stored, p is left
// to be discarded; the stored file's directory is fsynced anyway (its
// writer may still be between rename and fsync) and its time refreshed,
// which protects it through a GC grace period.
func (s *Store) seal(p *pending) error {
	tmp, a := p.f, p.addr
	dst := s.Path(a)
	if s.Has(a) {
		now := time.Now()
		if err := os.Chtimes(dst, now, now); err != nil {
			return fmt.Errorf("store: object %s: %w", a, err)
		}
		return syncDir(filepath.Dir(dst))
	}
	if err := tmp.Chmod(0o400); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	// A new object is as young as its naming, not its writing: a file
	// staged long before (a slow import) must still get the whole GC
	// grace period before the record that names it is stored.
	now := time.Now()
	if err := os.Chtimes(tmp.Name(), now, now); err != nil {
		return fmt.Errorf("store: object %s: %w", a, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("store: fsync object %s: %w", a, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("store: object %s: %w", a, err)
	}
	p.renamed = true
	return syncDir(filepath.Dir(dst))
}

func syncDir(dir string) error {
	if err := atomicfile.SyncDir(dir); err != nil {
		return fmt.Errorf("store: fsync %s: %w", dir, err)
	}
	return nil
}
