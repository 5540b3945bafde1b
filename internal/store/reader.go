package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

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
	b, p, err := s.readWhole(a, -1)
	if err != nil {
		return nil, err
	}
	if got := record.Sum(b); got != a {
		return nil, &CorruptError{Address: a, Got: got, Path: p}
	}
	return b, nil
}

// errTooLarge is readWhole's refusal of an object over its limit.
var errTooLarge = errors.New("object over the limit")

// readWhole reads an object's bytes, unverified, into a buffer of the
// size the file has, and names the file. An object of more than max bytes
// (when max is not negative) is errTooLarge, read no further than that.
func (s *Store) readWhole(a record.Address, max int64) ([]byte, string, error) {
	p := s.Path(a)
	f, err := os.Open(p)
	if err != nil {
		return nil, p, notFound(a, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, p, fmt.Errorf("object %s: %w", a, err)
	}
	if max >= 0 && info.Size() > max {
		return nil, p, errTooLarge
	}
	// One byte more than the size, to see the end in the first pass; a
	// file that grew since the Stat grows the buffer as os.ReadFile's.
	b := make([]byte, 0, info.Size()+1)
	for {
		if len(b) == cap(b) {
			if max >= 0 && int64(len(b)) > max {
				return nil, p, errTooLarge
			}
			b = append(b, 0)[:len(b)]
		}
		n, err := f.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, p, fmt.Errorf("object %s: %w", a, err)
		}
	}
	if max >= 0 && int64(len(b)) > max {
		return nil, p, errTooLarge
	}
	return b, p, nil
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

// OpenFile is [Store.Open] over the file at p, which is to hold object a:
// a file staged and not adopted yet. It verifies as it reads.
func OpenFile(p string, a record.Address) (*Reader, error) {
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
