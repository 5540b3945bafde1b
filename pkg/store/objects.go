package store

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"
	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// bufPool holds the buffers objects are streamed through: large enough
// that hashing, not syscalls, bounds the rate.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// Path returns where an object's file lives (whether or not it exists).
// Reading it directly is not verified.
func (s *Store) Path(a record.Address) string {
	t := a.String()[len(record.AddressPrefix):]
	return filepath.Join(s.objects, t[:2], t[2:])
}

// Has reports whether the object's file exists.
func (s *Store) Has(a record.Address) bool {
	_, err := os.Lstat(s.Path(a))
	return err == nil
}

// Put streams r into the store and returns its address. refs declares the
// objects this one refers to (kept for reachability); they must already be
// in the store. The object is durable when Put returns.
func (s *Store) Put(r io.Reader, refs ...record.Address) (record.Address, error) {
	for _, a := range refs {
		if !s.Has(a) {
			return record.Address{}, fmt.Errorf("store: %w: a new object refers to %s", ErrMissingObject, a)
		}
	}
	tmp, err := os.CreateTemp(filepath.Join(s.objects, "tmp"), "put-*")
	if err != nil {
		return record.Address{}, fmt.Errorf("store: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	h := blake3.New(32, nil)
	bp := bufPool.Get().(*[]byte)
	_, err = copyLarge(io.MultiWriter(tmp, h), r, *bp)
	bufPool.Put(bp)
	if err != nil {
		tmp.Close()
		return record.Address{}, fmt.Errorf("store: writing object: %w", err)
	}
	var a record.Address
	h.Sum(a[:0])
	if err := s.seal(tmp, a); err != nil {
		return record.Address{}, err
	}
	return a, s.setRefs(a, refs)
}

// PutBytes stores b; see [Store.Put].
func (s *Store) PutBytes(b []byte, refs ...record.Address) (record.Address, error) {
	return s.Put(bytes.NewReader(b), refs...)
}

// seal makes tmp the object a: fsync the data, rename it into place, fsync
// the directory so the name survives a crash too. An object already present
// is kept and tmp discarded.
func (s *Store) seal(tmp *os.File, a record.Address) error {
	defer tmp.Close()
	dst := s.Path(a)
	if s.Has(a) {
		return nil
	}
	if err := tmp.Chmod(0o400); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("store: fsync object: %w", err)
	}
	return s.place(tmp.Name(), dst)
}

// place renames a durable file to dst and fsyncs dst's directory.
func (s *Store) place(src, dst string) error {
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := os.Rename(src, dst); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: fsync %s: %w", dir, err)
	}
	return nil
}

func (s *Store) setRefs(a record.Address, refs []record.Address) error {
	if len(refs) == 0 {
		return nil
	}
	v := make([]byte, 0, 32*len(refs))
	for _, r := range refs {
		v = append(v, r[:]...)
	}
	return s.commit(func(tx *bolt.Tx) error { return tx.Bucket(bktRefs).Put(a[:], v) })
}

// Refs returns the objects a declared to refer to.
func (s *Store) Refs(a record.Address) ([]record.Address, error) {
	var out []record.Address
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktRefs).Get(a[:])
		if len(v)%32 != 0 {
			return fmt.Errorf("store: %w: refs of %s are %d bytes", ErrDamaged, a, len(v))
		}
		for i := 0; i < len(v); i += 32 {
			out = append(out, record.Address(v[i:i+32]))
		}
		return nil
	})
	return out, err
}

// Open returns a reader over the object that verifies as it goes: reading
// to the end returns [ErrCorrupt] (a [*CorruptError]) instead of io.EOF if
// the bytes do not hash to a. Close it.
func (s *Store) Open(a record.Address) (io.ReadCloser, error) {
	p := s.Path(a)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("store: %w: %s", ErrMissingObject, a)
		}
		return nil, fmt.Errorf("store: %w", err)
	}
	return &verifier{f: f, h: blake3.New(32, nil), want: a, path: p}, nil
}

type verifier struct {
	f    *os.File
	h    *blake3.Hasher
	want record.Address
	path string
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.f.Read(p)
	v.h.Write(p[:n])
	if err == io.EOF {
		var got record.Address
		v.h.Sum(got[:0])
		if got != v.want {
			return n, &CorruptError{Address: v.want, Got: got, Path: v.path}
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.f.Close() }

// ReadAll returns a small object's verified bytes.
func (s *Store) ReadAll(a record.Address) ([]byte, error) {
	r, err := s.Open(a)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// Verify rehashes an object's file against its address.
func (s *Store) Verify(a record.Address) error {
	r, err := s.Open(a)
	if err != nil {
		return err
	}
	defer r.Close()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	_, err = copyLarge(io.Discard, r, *bp)
	return err
}

// copyLarge copies through buf alone. io.Copy would hand the copy to
// os.File.WriteTo or io.Discard.ReadFrom, which use 8–32 KiB buffers, and
// BLAKE3 is several times slower on writes that small than on 1 MiB ones.
func copyLarge(dst io.Writer, src io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// Size returns an object's size in bytes.
func (s *Store) Size(a record.Address) (int64, error) {
	st, err := os.Stat(s.Path(a))
	if err != nil {
		return 0, fmt.Errorf("store: %w: %s", ErrMissingObject, a)
	}
	return st.Size(), nil
}
