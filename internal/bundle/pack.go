package bundle

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Packs (format 2, docs/bundle.md "Packs"): a member pack/N carries a run
// of consecutive small objects, each as its length (a uvarint, spelled in
// the fewest bytes) then its bytes, with no name: an object's address is
// the hash of its bytes.
const (
	// PackObject is the largest object a pack carries. The exporter packs
	// every object of at most this size and writes a larger one as an
	// objects/ member; a reader refuses a packed object over it, so that
	// it holds at most one such object in memory at a time.
	PackObject = 1 << 20
	// PackMax is the largest pack member. The exporter starts a new pack
	// before one would grow past it; a reader refuses a larger one.
	PackMax = 64 << 20
	// maxLenBytes is the most bytes a length of at most PackObject takes.
	maxLenBytes = 3
)

// packed says whether the exporter packs an object of n bytes.
func packed(n int64) bool { return n <= PackObject }

// frame is the bytes an object of n bytes takes in a pack.
func frame(n int64) int64 { return int64(len(binary.AppendUvarint(nil, uint64(n)))) + n }

// packName is the name of the bundle's pack member i (from 0).
func packName(i int) string { return "pack/" + strconv.Itoa(i) }

// AppendPack appends object b to pack p as a pack member carries it: its
// length as a uvarint, then its bytes.
func AppendPack(p, b []byte) []byte { return append(binary.AppendUvarint(p, uint64(len(b))), b...) }

// ReadPack decodes a pack member of size bytes read from r, calling fn
// with each object's bytes in order (valid until fn returns; fn's error
// stops the reading and is returned). A pack that does not decode whole —
// cut inside a length or an object, a length past its end, a length
// spelled in more bytes than it needs, an object over [PackObject] — is
// [ErrMalformed]. An empty pack decodes to no object (a bundle refuses
// it as a member).
func ReadPack(r io.Reader, size int64, fn func(b []byte) error) error {
	p := newPackReader(io.LimitReader(r, size), size, "pack")
	for {
		n, err := p.length()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		b, err := p.object(n)
		if err != nil {
			return err
		}
		if err := fn(b); err != nil {
			return err
		}
	}
}

// packReader reads a pack member's objects one at a time: each length
// before its bytes, so that the length can be judged before they are read.
type packReader struct {
	r    *bufio.Reader
	name string // what errors name
	left int64  // the member's bytes not yet read
	buf  []byte
}

func newPackReader(r io.Reader, size int64, name string) *packReader {
	// A buffer no larger than the member: a pack of one tiny object must
	// not cost 64 KiB.
	return &packReader{r: bufio.NewReaderSize(r, int(min(size, 64<<10))), name: name, left: size}
}

// length reads the next object's length: io.EOF at the member's end, and
// only there.
func (p *packReader) length() (int64, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	var v int64
	for i := 0; ; i++ {
		switch {
		case i == maxLenBytes:
			return 0, fmt.Errorf("%w: %s: a length of more than %d bytes (an object over %d bytes, which is no packed object)", ErrMalformed, p.name, maxLenBytes, PackObject)
		case p.left == 0:
			return 0, fmt.Errorf("%w: %s: the member ends inside a length", ErrMalformed, p.name)
		}
		c, err := p.r.ReadByte()
		if err != nil {
			return 0, cut(err)
		}
		p.left--
		v |= int64(c&0x7f) << (7 * i)
		if c < 0x80 {
			if c == 0 && i > 0 {
				return 0, fmt.Errorf("%w: %s: a length spelled in more bytes than it needs", ErrMalformed, p.name)
			}
			break
		}
	}
	switch {
	case v > PackObject:
		return 0, fmt.Errorf("%w: %s: a packed object of %d bytes, over the %d a pack carries", ErrMalformed, p.name, v, PackObject)
	case v > p.left:
		return 0, fmt.Errorf("%w: %s: an object of %d bytes, and the member has %d left", ErrMalformed, p.name, v, p.left)
	}
	return v, nil
}

// object reads the n bytes of the object whose length was just read.
func (p *packReader) object(n int64) ([]byte, error) {
	if int64(cap(p.buf)) < n {
		p.buf = make([]byte, n)
	}
	b := p.buf[:n]
	if _, err := io.ReadFull(p.r, b); err != nil {
		return nil, cut(err)
	}
	p.left -= n
	return b, nil
}

// cut is a read that failed inside a pack: a stream that ended early is
// io.ErrUnexpectedEOF, as for any other member.
func cut(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %w", ErrMalformed, err)
}

// stagePack stages the objects of pack member hdr (format 2): the member
// is judged by [Staged.admitPack] before a byte of it is read, each
// object's length by [Staged.admitPacked] before its bytes are, and each
// object is then hashed (its address), refused if the bundle carried it
// already, and staged in the order it came.
func (s *Staged) stagePack(ctx context.Context, m entry, lim Limits) error {
	hdr := m.hdr
	if err := s.admitPack(hdr); err != nil {
		return err
	}
	p := newPackReader(m.tr, hdr.Size, hdr.Name)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := p.length()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := s.admitPacked(hdr.Name, n, lim); err != nil {
			return err
		}
		b, err := p.object(n)
		if err != nil {
			return err
		}
		if err := s.stagePacked(b); err != nil {
			return err
		}
	}
	if took := m.took(); hdr.Size > took {
		return fmt.Errorf("%w: %s read as %d bytes from %d bytes of stream", ErrMalformed, hdr.Name, hdr.Size, took)
	}
	s.packs++
	return nil
}

// admitPack checks a pack member's header before anything of it is read:
// a plain regular file named pack/N, N the count of packs before it in
// decimal, not empty, at most [PackMax] bytes, and no larger than what
// bundle.json declares is left could take (the bytes left, and a length of
// [maxLenBytes] for each object left).
func (s *Staged) admitPack(hdr *tar.Header) error {
	if err := member(hdr); err != nil {
		return err
	}
	if want := packName(s.packs); hdr.Name != want {
		return fmt.Errorf("%w: member %q where %s was expected", ErrMalformed, hdr.Name, want)
	}
	h := s.Header
	// The objects left count at most PackMax lengths (no pack holds more),
	// and the lengths are taken from the pack's size, not added to the
	// bytes left: nothing overflows, whatever count and total the limits
	// allow.
	lengths := min(int64(h.Objects-s.Objects), PackMax) * maxLenBytes
	switch {
	case hdr.Size == 0:
		return fmt.Errorf("%w: %s is empty", ErrMalformed, hdr.Name)
	case hdr.Size > PackMax:
		return fmt.Errorf("%w: %s of %d bytes, the limit of a pack is %d", ErrLimit, hdr.Name, hdr.Size, int64(PackMax))
	case hdr.Size-lengths > h.Bytes-s.Bytes:
		return fmt.Errorf("%w: %s of %d bytes is larger than the objects bundle.json declares are left could take (%d bytes, %d of lengths)",
			ErrMalformed, hdr.Name, hdr.Size, h.Bytes-s.Bytes, lengths)
	}
	return nil
}

// admitPacked checks a packed object's length before its bytes are read:
// within the count bundle.json declares, the object limit, and the bytes
// bundle.json declares are left.
func (s *Staged) admitPacked(pack string, n int64, lim Limits) error {
	return s.fits(pack+": ", "an object", n, lim)
}

// stagePacked stages a packed object's bytes under their address.
func (s *Staged) stagePacked(b []byte) error {
	a := record.Sum(b)
	if _, dup := s.staged[a]; dup {
		return fmt.Errorf("%w: object %s twice", ErrMalformed, a)
	}
	p := filepath.Join(s.dir, strings.TrimPrefix(a.String(), record.AddressPrefix))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	s.add(a, p, int64(len(b)))
	return nil
}
