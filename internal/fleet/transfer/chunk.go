package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// A chunk of a slab over the peer link: the source serves one range of
// an object's bytes (GET /v1/objects/{addr} with a Range header), and the
// asker keeps them only if they hash to the chunk's address in the
// verified index that lists them (store.DecodeSlabIndex). The source does
// not verify a range: only the whole object hashes to its address.

// MaxRange is the most bytes one ranged read may ask for: a chunk
// (store.MaxChunk).
const MaxRange = store.MaxChunk

// ErrMismatch: bytes a peer sent that do not hash to the address a
// verified index or listing gives them — the peer's bytes are wrong, not
// the link (ErrChunk; an owed slab as a whole, [Owed.Fill]). It wraps
// store.ErrCorrupt.
var ErrMismatch = fmt.Errorf("the peer's bytes do not hash to their verified address: %w", store.ErrCorrupt)

// ErrChunk: a ranged read whose bytes do not hash to the chunk's listed
// address. It wraps ErrMismatch.
var ErrChunk = fmt.Errorf("chunk does not hash to its listed address: %w", ErrMismatch)

// parseRange reads a Range header of exactly one range, "bytes=A-B"
// (decimal, A <= B, both inclusive), with B-A+1 at most MaxRange.
func parseRange(h string) (off, n int64, err error) {
	spec, ok := strings.CutPrefix(h, "bytes=")
	first, last, ok2 := strings.Cut(spec, "-")
	if !ok || !ok2 {
		return 0, 0, fmt.Errorf("range %q: not bytes=FIRST-LAST", h)
	}
	a, err1 := strconv.ParseUint(first, 10, 63)
	b, err2 := strconv.ParseUint(last, 10, 63)
	switch {
	case err1 != nil || err2 != nil || strconv.FormatUint(a, 10) != first || strconv.FormatUint(b, 10) != last:
		return 0, 0, fmt.Errorf("range %q: not bytes=FIRST-LAST in decimal", h)
	case b < a:
		return 0, 0, fmt.Errorf("range %q: ends before it starts", h)
	case b-a+1 > MaxRange:
		return 0, 0, fmt.Errorf("range %q: over %d bytes", h, MaxRange)
	}
	return int64(a), int64(b - a + 1), nil
}

// serveRange answers a ranged GET of object a: 206 and the n bytes at off
// as the store holds them, 416 for a range past the object's end.
func serveRange(st *store.Store, w http.ResponseWriter, a record.Address, spec string) {
	off, n, err := parseRange(spec)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, err)
		return
	}
	f, err := os.Open(st.Path(a))
	if errors.Is(err, os.ErrNotExist) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Errorf("%w: %s", store.ErrMissingObject, a))
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err)
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, fmt.Errorf("object %s: not a regular file (%v)", a, err))
		return
	}
	if size := info.Size(); off >= size || n > size-off { // off+n may overflow
		w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(info.Size(), 10))
		writeError(w, http.StatusRequestedRangeNotSatisfiable, api.CodeBadRequest, fmt.Errorf("object %s holds %d bytes, the range is %s", a, info.Size(), spec))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, off+n-1, info.Size()))
	w.WriteHeader(http.StatusPartialContent)
	if _, err := io.Copy(w, io.NewSectionReader(f, off, n)); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// Range is one chunk asked of a peer: Size bytes at Offset of the object
// Object (a slab), which must hash to Sum (its index's record).
type Range struct {
	Object record.Address
	Offset uint64
	Size   uint64
	Sum    record.Address
}

// RangeTimeout bounds one ranged read, its answer and body: a peer that
// stalls is given up on (the caller's context may have no end). A
// variable: tests shorten it.
var RangeTimeout = time.Minute

// ReadRange asks the peer at from for rg and returns its bytes: only a
// 206 whose Content-Range is rg's, of exactly Size bytes, that hash to
// Sum ([ErrChunk] otherwise). A 404 is [ErrAbsent], any other answer
// [ErrPeer]; a body cut short [ErrTruncated].
func ReadRange(ctx context.Context, from Source, rg Range) ([]byte, error) {
	return readRange(ctx, from, rg, true)
}

// readRange is ReadRange, checking Sum only when check is set (a range
// verified by the whole object it is part of).
func readRange(ctx context.Context, from Source, rg Range, check bool) ([]byte, error) {
	if rg.Size == 0 || rg.Size > MaxRange || rg.Offset > 1<<62 {
		return nil, fmt.Errorf("transfer: %w: a range of %d bytes at %d", ErrLimit, rg.Size, rg.Offset)
	}
	url := strings.TrimSuffix(from.Base, "/") + "/v1/objects/" + rg.Object.String()
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, RangeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("transfer: %w", err)
	}
	last := rg.Offset + rg.Size - 1
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", rg.Offset, last))
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := from.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("transfer: object %s: %w", rg.Object, err)
	}
	defer resp.Body.Close()
	what := fmt.Sprintf("object %s at %d", rg.Object, rg.Offset)
	cr := resp.Header.Get("Content-Range")
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("transfer: %s: %w: %s", what, ErrAbsent, peerMessage(resp.Body))
	case resp.StatusCode != http.StatusPartialContent:
		return nil, fmt.Errorf("transfer: %s: %w: %s: %s", what, ErrPeer, resp.Status, peerMessage(resp.Body))
	case resp.ContentLength != int64(rg.Size):
		return nil, fmt.Errorf("transfer: %s: %w: %d bytes declared, %d asked", what, ErrPeer, resp.ContentLength, rg.Size)
	case !strings.HasPrefix(cr, fmt.Sprintf("bytes %d-%d/", rg.Offset, last)):
		return nil, fmt.Errorf("transfer: %s: %w: Content-Range %q", what, ErrPeer, cr)
	}
	b := make([]byte, rg.Size)
	if n, err := io.ReadFull(resp.Body, b); err != nil {
		if outer.Err() != nil {
			return nil, outer.Err()
		}
		if ctx.Err() != nil { // RangeTimeout: a source that stalled
			err = ctx.Err()
		}
		return nil, fmt.Errorf("transfer: %s: %w: %d of its %d bytes (%w)", what, ErrTruncated, n, rg.Size, err)
	}
	if check {
		if err := checkChunk(rg.Object, rg.Offset, b, rg.Sum); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// checkChunk refuses b, the bytes at off of object obj, unless they hash
// to sum, their chunk's listed address ([ErrChunk]).
func checkChunk(obj record.Address, off uint64, b []byte, sum record.Address) error {
	if got := record.Sum(b); got != sum {
		return fmt.Errorf("transfer: object %s at %d: %w: %d bytes hash to %s, listed as %s", obj, off, ErrChunk, len(b), got, sum)
	}
	return nil
}
