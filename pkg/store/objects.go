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
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// bufSize is the size of the buffers objects are streamed through: large
// enough that BLAKE3 runs its widest SIMD path and the syscall count is
// small. io.Copy's 32 KiB buffers hashed at a third of the rate. Objects
// known to be small (most are: attestations, receipts, manifests) go
// through a small buffer instead.
const (
	bufSize   = 1 << 20
	smallSize = 64 << 10
)

var (
	bufPool   = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}
	smallPool = sync.Pool{New: func() any { b := make([]byte, smallSize); return &b }}
)

// Path returns the file an object lives in, whether or not it exists:
// objects/<c>/<text>, where <text> is the address's text without "b3:"
// and <c> its first character. Reading the file directly is not verified;
// it is for local hot paths that trust the disk.
func (s *Store) Path(a record.Address) string {
	t := a.String()[len(record.AddressPrefix):]
	return filepath.Join(s.objects, t[:1], t)
}

// Has reports whether the object is in the store. It does not read it.
func (s *Store) Has(a record.Address) bool {
	info, err := os.Lstat(s.Path(a))
	return err == nil && info.Mode().IsRegular()
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

// addRefs records that a refers to refs, as the union with what a already
// declared. It commits only if that adds something.
func (s *Store) addRefs(a record.Address, refs []record.Address) error {
	if len(refs) == 0 {
		return nil
	}
	old, err := s.Refs(a)
	if err != nil {
		return err
	}
	merged := appendNew(old, refs)
	if len(merged) == len(old) {
		return nil
	}
	v := make([]byte, 0, 32*len(merged))
	for _, r := range merged {
		v = append(v, r[:]...)
	}
	return s.commit(func(tx *bolt.Tx) error { return tx.Bucket(bktRefs).Put(a[:], v) })
}

// appendNew appends to dst each address of add not already in it.
func appendNew(dst, add []record.Address) []record.Address {
	seen := make(map[record.Address]bool, len(dst)+len(add))
	for _, a := range dst {
		seen[a] = true
	}
	for _, a := range add {
		if !seen[a] {
			seen[a] = true
			dst = append(dst, a)
		}
	}
	return dst
}

// Refs returns the objects a declared, when it was put, that it refers to.
func (s *Store) Refs(a record.Address) ([]record.Address, error) {
	var out []record.Address
	err := s.view(func(tx *bolt.Tx) error {
		var err error
		out, err = getRefs(tx, a)
		return err
	})
	return out, err
}

func getRefs(tx *bolt.Tx, a record.Address) ([]record.Address, error) {
	v := tx.Bucket(bktRefs).Get(a[:])
	if len(v)%32 != 0 {
		return nil, fmt.Errorf("store: %w: refs of %s are %d bytes", ErrDamaged, a, len(v))
	}
	out := make([]record.Address, 0, len(v)/32)
	for i := 0; i < len(v); i += 32 {
		out = append(out, record.Address(v[i:i+32]))
	}
	return out, nil
}

// Open returns a reader over an object that verifies as it reads: at the
// end of the bytes it returns io.EOF only if they hash to a, and a
// [*CorruptError] otherwise. A caller that stops before the end has read
// unverified bytes. Close it.
func (s *Store) Open(a record.Address) (*Reader, error) {
	p := s.Path(a)
	f, err := os.Open(p)
	if err != nil {
		return nil, notFound(a, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("object %s: %w", a, err)
	}
	return &Reader{f: f, h: blake3.New(32, nil), want: a, size: info.Size()}, nil
}

// Reader reads an object and verifies it at the end; see [Store.Open].
type Reader struct {
	f    *os.File
	h    *blake3.Hasher
	want record.Address
	size int64
	end  error // io.EOF or the *CorruptError, once the end is reached
}

// Size returns the object's size on disk.
func (r *Reader) Size() int64 { return r.size }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if r.end != nil {
		return 0, r.end
	}
	n, err := r.f.Read(p)
	r.h.Write(p[:n])
	if err == io.EOF {
		err = r.finish()
	}
	return n, err
}

func (r *Reader) finish() error {
	var got record.Address
	r.h.Sum(got[:0])
	r.end = io.EOF
	if got != r.want {
		r.end = &CorruptError{Address: r.want, Got: got, Path: r.f.Name()}
	}
	return r.end
}

// WriteTo implements io.WriterTo, so io.Copy streams the object through a
// large buffer. It returns nil only when the bytes verified.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	return r.writeTo(context.Background(), w)
}

func (r *Reader) writeTo(ctx context.Context, w io.Writer) (int64, error) {
	n, err := copyBuffered(ctx, w, readerOnly{r}, r.size)
	if err != nil {
		return n, err
	}
	if r.end != io.EOF {
		return n, r.end
	}
	return n, nil
}

// readerOnly hides Reader's WriteTo from copyBuffered's io.Reader.
type readerOnly struct{ io.Reader }

// Close closes the file.
func (r *Reader) Close() error { return r.f.Close() }

// ReadAll returns an object's bytes, verified: for small objects
// (attestations, manifests, listings).
func (s *Store) ReadAll(a record.Address) ([]byte, error) {
	r, err := s.Open(a)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var b bytes.Buffer
	b.Grow(int(r.size) + 1)
	if _, err := r.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Verify rehashes an object against its address: nil, [ErrMissingObject]
// or a [*CorruptError].
func (s *Store) Verify(ctx context.Context, a record.Address) error {
	r, err := s.Open(a)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = r.writeTo(ctx, io.Discard)
	return err
}

// copyBuffered copies src to dst through a pooled buffer, checking ctx
// between reads. (io.Copy would hand the copy to os.File.WriteTo or
// io.Discard's ReadFrom, with buffers of 8 to 32 KiB.) size is what src
// is expected to hold, or -1 if unknown; it only picks the buffer. A
// reader's error other than io.EOF is returned; a *CorruptError among them.
func copyBuffered(ctx context.Context, dst io.Writer, src io.Reader, size int64) (int64, error) {
	pool := &bufPool
	if size >= 0 && size < smallSize {
		pool = &smallPool
	}
	bp := pool.Get().(*[]byte)
	defer pool.Put(bp)
	buf := *bp
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, err := io.ReadFull(src, buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		switch err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return n, nil
		default:
			return n, err
		}
	}
}
