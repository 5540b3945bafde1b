package transfer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// plain makes sure st holds a for the run, an object with no refs, or
// stages it: fetched into staging, hashed on the way, and kept only if it
// hashes to a. size is what a listing says the object holds, or -1.
func (f *fetcher) plain(a record.Address, size int64) error {
	if _, isStaged := f.out.staged[a]; isStaged || f.held(a) {
		if size >= 0 {
			n, err := f.out.Size(a)
			if err != nil {
				return err
			}
			if n != size {
				return fmt.Errorf("transfer: object %s: %w: listed as %d bytes, the store holds %d", a, ErrMalformed, size, n)
			}
		}
		if !isStaged {
			f.rehash.add(a)
		}
		f.stats.Skipped++
		return nil
	}
	body, n, err := f.get(a, f.lim.Object, size)
	if err != nil {
		return err
	}
	defer body.Close()
	p := f.path(a)
	if err := f.stage(body, p, a, n); err != nil {
		os.Remove(p)
		return err
	}
	f.out.add(a, p, n, nil)
	f.stats.Objects++
	f.stats.Bytes += n
	return nil
}

// path is where object a is staged.
func (f *fetcher) path(a record.Address) string {
	return filepath.Join(f.out.dir, strings.TrimPrefix(a.String(), record.AddressPrefix))
}

// stageBytes stages b, verified as a already, with refs.
func (f *fetcher) stageBytes(a record.Address, b []byte, refs []record.Address) error {
	p := f.path(a)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		os.Remove(p)
		return fmt.Errorf("transfer: %w", err)
	}
	f.out.add(a, p, int64(len(b)), refs)
	f.stats.Objects++
	f.stats.Bytes += int64(len(b))
	return nil
}

// stage writes the n bytes of body to the new file p, hashing them, and
// checks that they are n and hash to a.
func (f *fetcher) stage(body io.Reader, p string, a record.Address, n int64) error {
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("transfer: %w", err)
	}
	defer w.Close()
	h := blake3.New(32, nil)
	if err := f.take(io.MultiWriter(w, h), body, a, n); err != nil {
		return err
	}
	return f.verify(a, h)
}

// take copies the n bytes of body to w. (net/http marks a body of a
// declared length ended once that many bytes are read, and gives its
// connection back to be used again: TestFetchOneConnection.)
func (f *fetcher) take(w io.Writer, body io.Reader, a record.Address, n int64) error {
	got, err := f.copy(w, io.LimitReader(body, n))
	if err := f.ctx.Err(); err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("transfer: object %s: %w: %d of its %d bytes (%v)", a, ErrTruncated, got, n, err)
	}
	if err != nil {
		return fmt.Errorf("transfer: object %s: %w", a, err)
	}
	return nil
}

// verify checks that h, over an object's bytes, hashes to a.
func (f *fetcher) verify(a record.Address, h *blake3.Hasher) error {
	var got record.Address
	h.Sum(got[:0])
	if got != a {
		return fmt.Errorf("transfer: %w", &store.CorruptError{Address: a, Got: got, Path: f.url(a)})
	}
	return nil
}

// document returns the bytes of a, an object to be decoded (an
// attestation, a listing): read verified from st if it holds a for the
// run (held), else fetched and verified. Either way at most the JSON
// limit.
func (f *fetcher) document(a record.Address) (_ []byte, held bool, _ error) {
	max := min(f.lim.JSON, f.lim.Object)
	if b, ok := f.pre[a]; ok {
		return b, false, nil
	}
	if s, ok := f.out.staged[a]; ok {
		// Staged as a plain object already (verified then).
		if s.size > max {
			return nil, false, fmt.Errorf("transfer: object %s: %w: %d bytes to decode, the limit is %d", a, ErrLimit, s.size, max)
		}
		b, err := os.ReadFile(s.path)
		if err == nil && record.Sum(b) != a {
			err = &store.CorruptError{Address: a, Got: record.Sum(b), Path: s.path}
		}
		return b, false, err
	}
	if f.held(a) {
		n, err := f.st.Size(a)
		if err != nil {
			return nil, false, err
		}
		if n > max {
			return nil, false, fmt.Errorf("transfer: object %s: %w: %d bytes to decode, the limit is %d", a, ErrLimit, n, max)
		}
		b, err := f.st.ReadAll(a)
		f.stats.Skipped++
		return b, true, err
	}
	body, n, err := f.get(a, max, -1)
	if err != nil {
		return nil, false, err
	}
	defer body.Close()
	var buf bytes.Buffer
	buf.Grow(int(n))
	h := blake3.New(32, nil)
	if err := f.take(io.MultiWriter(&buf, h), body, a, n); err != nil {
		return nil, false, err
	}
	if err := f.verify(a, h); err != nil {
		return nil, false, err
	}
	return buf.Bytes(), false, nil
}

func (f *fetcher) url(a record.Address) string {
	return strings.TrimSuffix(f.base, "/") + "/v1/objects/" + a.String()
}

// get asks the peer for a and returns its body and the size it declares:
// at most max, size if size is not -1, and within what the fetch may still
// take. The caller closes the body.
func (f *fetcher) get(a record.Address, max, size int64) (io.ReadCloser, int64, error) {
	req, err := http.NewRequestWithContext(f.ctx, http.MethodGet, f.url(a), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("transfer: %w", err)
	}
	// Asked for explicitly, no transport decompresses the body: the
	// bytes read are the bytes sent, as many as Content-Length says.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := f.c.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("transfer: object %s: %w", a, err)
	}
	n := resp.ContentLength
	err = nil
	switch {
	case resp.StatusCode == http.StatusNotFound:
		err = fmt.Errorf("transfer: object %s: %w: %s", a, ErrAbsent, peerMessage(resp.Body))
	case resp.StatusCode != http.StatusOK:
		err = fmt.Errorf("transfer: object %s: %w: %s: %s", a, ErrPeer, resp.Status, peerMessage(resp.Body))
	case n < 0:
		err = fmt.Errorf("transfer: object %s: %w: no Content-Length", a, ErrPeer)
	case n > max:
		err = fmt.Errorf("transfer: object %s: %w: %d bytes, the limit is %d", a, ErrLimit, n, max)
	case size >= 0 && n != size:
		err = fmt.Errorf("transfer: object %s: %w: listed as %d bytes, the peer sends %d", a, ErrMalformed, size, n)
	default:
		err = f.book(a, n)
	}
	if err != nil {
		resp.Body.Close()
		return nil, 0, err
	}
	return resp.Body, n, nil
}

// book counts n bytes of object a against the fetch's Total limit and
// the store's room: those of an object fetched, or owed (they arrive
// later).
func (f *fetcher) book(a record.Address, n int64) error {
	switch {
	case n > f.lim.Total-f.taken:
		return fmt.Errorf("transfer: object %s: %w: %d bytes after %d, the limit of a fetch is %d", a, ErrLimit, n, f.taken, f.lim.Total)
	case f.room >= 0 && n > f.room-f.taken:
		return fmt.Errorf("transfer: object %s: %w: %d bytes after %d, the store's filesystem takes %d past its minimum free space (--min-free)", a, ErrNoSpace, n, f.taken, f.room)
	}
	f.taken += n
	return nil
}

// peerMessage is the message of an error body, read to at most 4 KiB.
func peerMessage(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 4<<10))
	var e api.Error
	if json.Unmarshal(b, &e) == nil && e.Message != "" {
		return fmt.Sprintf("%s (%s)", e.Message, e.Code)
	}
	return fmt.Sprintf("%q", b)
}

// copy copies src to dst through the fetch's 1 MiB buffer, checking its
// context between reads, and returns what it copied and the first error
// other than io.EOF.
func (f *fetcher) copy(dst io.Writer, src io.Reader) (int64, error) {
	if f.buf == nil {
		f.buf = make([]byte, 1<<20)
	}
	buf := f.buf
	var n int64
	for {
		if err := f.ctx.Err(); err != nil {
			return n, err
		}
		k, err := src.Read(buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
