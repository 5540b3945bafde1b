package bundle

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// counter counts the bytes read from the bundle's stream.
type counter struct {
	r io.Reader
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// paxAllowed are the PAX records a member may carry; anything else (the
// GNU sparse records above all, which make a few bytes of tar read as
// gigabytes) is refused.
var paxAllowed = map[string]bool{"path": true, "size": true, "mtime": true, "atime": true, "ctime": true,
	"uid": true, "gid": true, "uname": true, "gname": true}

// member checks a member's header before anything of it is read.
func member(hdr *tar.Header) error {
	if hdr.Typeflag != tar.TypeReg {
		return fmt.Errorf("%w: member %q has type %q: only regular files (typeflag '0') are read, never sparse files, links or devices", ErrMalformed, hdr.Name, hdr.Typeflag)
	}
	for k := range hdr.PAXRecords {
		if !paxAllowed[k] {
			return fmt.Errorf("%w: member %q carries the PAX record %q (sparse and vendor records are refused)", ErrMalformed, hdr.Name, k)
		}
	}
	if hdr.Size < 0 {
		return fmt.Errorf("%w: member %q has size %d", ErrMalformed, hdr.Name, hdr.Size)
	}
	return nil
}

// readJSON reads the next member, which must be name, of at most max
// bytes, and decodes it strictly.
func readJSON(tr *tar.Reader, name string, max int64) ([]byte, error) {
	hdr, err := tr.Next()
	if err != nil || hdr.Name != name {
		return nil, fmt.Errorf("%w: %s expected next", ErrMalformed, name)
	}
	if err := member(hdr); err != nil {
		return nil, err
	}
	if hdr.Size > max {
		return nil, fmt.Errorf("%w: %s of %d bytes, the limit is %d", ErrLimit, name, hdr.Size, max)
	}
	b, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformed, name, err)
	}
	if int64(len(b)) != hdr.Size {
		return nil, fmt.Errorf("%w: %s: %d of %d bytes", ErrMalformed, name, len(b), hdr.Size)
	}
	return b, nil
}

// stageObject writes at most size bytes of r to p, hashing them as they
// are written, and stops at the first byte past size.
func stageObject(ctx context.Context, r io.Reader, p string, size int64) (record.Address, int64, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return record.Address{}, 0, err
	}
	defer f.Close()
	h := blake3.New(32, nil)
	// A buffer no larger than the member (and the byte past it): a tiny
	// member must not cost a megabyte cleared.
	buf := make([]byte, min(size+1, 1<<20))
	lr := io.LimitReader(r, size+1)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return record.Address{}, 0, err
		}
		k, rerr := lr.Read(buf)
		if k > 0 {
			if n+int64(k) > size {
				return record.Address{}, 0, fmt.Errorf("%w: %s: more bytes than its declared %d", ErrMalformed, filepath.Base(p), size)
			}
			h.Write(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				return record.Address{}, 0, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return record.Address{}, 0, fmt.Errorf("%w: %w", ErrMalformed, rerr)
		}
	}
	var a record.Address
	h.Sum(a[:0])
	return a, n, nil
}
