package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// getRange is a GET with a Range header: its status, Content-Range and
// body.
func getRange(t *testing.T, url, spec string) (int, string, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Range", spec)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Range"), b.Bytes()
}

func TestHandlerRange(t *testing.T) {
	st := mustStore(t)
	body := bytes.Repeat([]byte("0123456789"), 1000)
	obj := mustPut(t, st, body)
	url := serve(t, st, nil).URL + "/v1/objects/" + obj.String()

	status, cr, b := getRange(t, url, "bytes=4096-8191")
	if status != http.StatusPartialContent || cr != "bytes 4096-8191/10000" || !bytes.Equal(b, body[4096:8192]) {
		t.Fatalf("range: %d %q %d bytes", status, cr, len(b))
	}
	for _, bad := range []string{"bytes=0-1,4-5", "bytes=-5", "bytes=5-", "bytes=01-5", "bytes=+1-5", "bytes=6-5", "items=0-5",
		"bytes=0-" + strconv.Itoa(transfer.MaxRange)} {
		status, _, b := getRange(t, url, bad)
		if status != http.StatusBadRequest || errorCode(t, b) != api.CodeBadRequest {
			t.Fatalf("range %q: %d %s, want 400 bad_request", bad, status, b)
		}
	}
	if status, cr, _ := getRange(t, url, "bytes=9000-10000"); status != http.StatusRequestedRangeNotSatisfiable || cr != "bytes */10000" {
		t.Fatalf("range past the end: %d %q", status, cr)
	}
	// A range ending at the largest offset: FIRST+length overflows an
	// int64, still past the end.
	top := strconv.FormatUint(1<<63-1, 10)
	if status, cr, _ := getRange(t, url, "bytes="+strconv.FormatUint(1<<63-16, 10)+"-"+top); status != http.StatusRequestedRangeNotSatisfiable || cr != "bytes */10000" {
		t.Fatalf("range at the top: %d %q, want 416", status, cr)
	}
	absent := serve(t, st, nil).URL + "/v1/objects/" + record.Sum([]byte("absent")).String()
	if status, _, b := getRange(t, absent, "bytes=0-1"); status != http.StatusNotFound || errorCode(t, b) != api.CodeNotFound {
		t.Fatalf("absent: %d %s", status, b)
	}
}

// slabFixture is a slab of three 16 KiB chunks with 4 KiB between the
// second and the third that no chunk covers, held by a source store.
type slabFixture struct {
	src    *store.Store
	slab   store.Entry
	chunks []store.SlabChunk
	bytes  []byte
}

func newSlab(t *testing.T) slabFixture {
	t.Helper()
	var b []byte
	var cs []store.SlabChunk
	for i, off := range []uint64{0, 16 << 10, 36 << 10} {
		for uint64(len(b)) < off {
			b = append(b, 0xee)
		}
		c := bytes.Repeat([]byte{byte(i + 1)}, 16<<10)
		cs = append(cs, store.SlabChunk{Vaddr: 0x400000 + off, Size: 16 << 10, Offset: off, Address: record.Sum(c)})
		b = append(b, c...)
	}
	src := mustStore(t)
	a := mustPut(t, src, b)
	return slabFixture{src: src, slab: store.Entry{Name: "pages-1.img.slabs/00", Mode: 0o600, Size: uint64(len(b)), Address: a}, chunks: cs, bytes: b}
}

// tamper serves ranges through h with the byte at off of the object
// flipped.
func tamper(off int64) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var first, last int64
			if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &first, &last); err != nil || off < first || off > last {
				h.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			b := rec.Body.Bytes()
			b[off-first] ^= 1
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(b)
		})
	}
}

func TestReadRange(t *testing.T) {
	fx := newSlab(t)
	c := fx.chunks[1]
	rg := transfer.Range{Object: fx.slab.Address, Offset: c.Offset, Size: c.Size, Sum: c.Address}
	ctx := context.Background()
	good := serve(t, fx.src, nil)
	b, err := transfer.ReadRange(ctx, transfer.Source{Client: good.Client(), Base: good.URL}, rg)
	if err != nil || !bytes.Equal(b, fx.bytes[c.Offset:c.Offset+c.Size]) {
		t.Fatalf("ReadRange: %v", err)
	}
	hostile := []struct {
		name string
		wrap func(http.Handler) http.Handler
		want error
	}{
		{"a flipped byte", tamper(int64(c.Offset) + 77), transfer.ErrChunk},
		{"the whole object", func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { r.Header.Del("Range"); h.ServeHTTP(w, r) })
		}, transfer.ErrPeer},
		{"another range", func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Header.Set("Range", fmt.Sprintf("bytes=0-%d", c.Size-1))
				h.ServeHTTP(w, r)
			})
		}, transfer.ErrPeer},
		{"a body cut short", func(http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.FormatUint(c.Size, 10))
				w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", c.Offset, c.Offset+c.Size-1, fx.slab.Size))
				w.WriteHeader(http.StatusPartialContent)
				w.Write(fx.bytes[c.Offset : c.Offset+100])
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			})
		}, transfer.ErrTruncated},
		{"not found", func(http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "{}", http.StatusNotFound) })
		}, transfer.ErrAbsent},
	}
	for _, tc := range hostile {
		srv := serve(t, fx.src, tc.wrap)
		if _, err := transfer.ReadRange(ctx, transfer.Source{Client: srv.Client(), Base: srv.URL}, rg); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if !errors.Is(transfer.ErrChunk, store.ErrCorrupt) {
		t.Fatal("ErrChunk is not store.ErrCorrupt")
	}
}

// counting counts the ranged reads of each offset.
type counting struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counting) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.n[r.Header.Get("Range")]++
		c.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func TestOwedFill(t *testing.T) {
	fx := newSlab(t)
	cnt := &counting{n: map[string]int{}}
	srv := serve(t, fx.src, cnt.wrap)
	dst := mustStore(t)
	o, err := transfer.NewOwed(dst, transfer.Source{Client: srv.Client(), Base: srv.URL}, fx.slab, fx.chunks)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx := context.Background()
	// A fault on the third chunk, asked by many at once: read once.
	i, ok := o.Find(fx.chunks[2].Offset, fx.chunks[2].Size)
	if !ok || i != 2 {
		t.Fatalf("Find: %d %v", i, ok)
	}
	if _, ok := o.Find(fx.chunks[2].Offset, 4096); ok {
		t.Fatal("Find took another size")
	}
	if err := o.Chunk(ctx, 3); !errors.Is(err, transfer.ErrOwed) {
		t.Fatalf("Chunk 3 of 3: %v", err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 8 {
		wg.Go(func() {
			if o.Chunk(ctx, i) != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatal("Chunk failed")
	}
	if held, of := o.Held(); held != 1 || of != 3 {
		t.Fatalf("held %d of %d, want 1 of 3", held, of)
	}
	if err := o.Fill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := o.Adopt(ctx, dst); err != nil {
		t.Fatal(err)
	}
	if !dst.Has(fx.slab.Address) {
		t.Fatal("the slab is not adopted")
	}
	for spec, n := range cnt.n {
		if n != 1 {
			t.Errorf("%s read %d times", spec, n)
		}
	}
	// The fault's chunk alone; the two before it back to back, in one
	// read; and the gap.
	if len(cnt.n) != 3 || cnt.n[fmt.Sprintf("bytes=0-%d", fx.chunks[1].Offset+fx.chunks[1].Size-1)] != 1 {
		t.Errorf("%d ranges read, want 3, the first two chunks in one: %v", len(cnt.n), cnt.n)
	}
}

// A read that fails on the link (here: the source answers 503 once, to
// the chunks' read or to the read of bytes no chunk covers) is not final,
// unlike wrong bytes: the next Fill brings the slab in. Seen failing
// first: the first failure stayed, for chunks already written too.
func TestOwedLinkFailureNotFinal(t *testing.T) {
	fx := newSlab(t)
	gap := fmt.Sprintf("bytes=%d-", fx.chunks[1].Offset+fx.chunks[1].Size)
	for _, failing := range []string{"bytes=0-", gap} {
		t.Run(failing, func(t *testing.T) { testOwedLinkFailure(t, fx, failing) })
	}
}

func testOwedLinkFailure(t *testing.T, fx slabFixture, failing string) {
	var failed atomic.Bool
	srv := serve(t, fx.src, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.Header.Get("Range"), failing) && failed.CompareAndSwap(false, true) {
				http.Error(w, "not now", http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	dst := mustStore(t)
	o, err := transfer.NewOwed(dst, transfer.Source{Client: srv.Client(), Base: srv.URL}, fx.slab, fx.chunks)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := o.Fill(t.Context()); !errors.Is(err, transfer.ErrPeer) {
		t.Fatalf("Fill with the source failing: %v, want ErrPeer", err)
	}
	if err := o.Chunk(t.Context(), 0); err != nil {
		t.Fatalf("Chunk 0 after a link failure: %v", err)
	}
	if err := o.Fill(t.Context()); err != nil {
		t.Fatalf("Fill again: %v", err)
	}
	if err := o.Adopt(t.Context(), dst); err != nil || !dst.Has(fx.slab.Address) {
		t.Fatalf("adopt: %v", err)
	}
}

func TestOwedRefused(t *testing.T) {
	fx := newSlab(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		off     int64
		want    error
		written bool // chunk 0 written before the refusal
	}{
		{"a chunk's byte", int64(fx.chunks[1].Offset) + 5, transfer.ErrChunk, false},
		{"a byte no chunk covers", int64(fx.chunks[2].Offset) - 1, transfer.ErrMismatch, true},
	} {
		srv := serve(t, fx.src, tamper(tc.off))
		dst := mustStore(t)
		o, err := transfer.NewOwed(dst, transfer.Source{Client: srv.Client(), Base: srv.URL}, fx.slab, fx.chunks)
		if err != nil {
			t.Fatal(err)
		}
		// Either is the source's bytes, verified wrong (ErrMismatch).
		if err := o.Fill(ctx); !errors.Is(err, tc.want) || !errors.Is(err, transfer.ErrMismatch) || !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s: Fill: %v, want %v", tc.name, err, tc.want)
		}
		// Final: no chunk is asked again, nothing is adopted; a chunk
		// written, verified, before the refusal is still answered.
		if err := o.Chunk(ctx, 0); tc.written != (err == nil) || (err != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: Chunk after the refusal: %v", tc.name, err)
		}
		if err := o.Adopt(ctx, dst); !errors.Is(err, tc.want) || dst.Has(fx.slab.Address) {
			t.Errorf("%s: Adopt: %v", tc.name, err)
		}
		o.Close()
	}
	// Chunks that do not fit the slab are refused before anything.
	dst := mustStore(t)
	bad := append([]store.SlabChunk{}, fx.chunks...)
	bad[1].Offset = 8 << 10 // overlaps the first
	if _, err := transfer.NewOwed(dst, transfer.Source{}, fx.slab, bad); !errors.Is(err, transfer.ErrOwed) {
		t.Fatalf("overlapping chunks: %v", err)
	}
	bad = append([]store.SlabChunk{}, fx.chunks...)
	bad[2].Offset = fx.slab.Size - 4096
	if _, err := transfer.NewOwed(dst, transfer.Source{}, fx.slab, bad); !errors.Is(err, transfer.ErrOwed) {
		t.Fatalf("a chunk past the slab: %v", err)
	}
	bad = append([]store.SlabChunk{}, fx.chunks...)
	bad[2].Offset = 1<<64 - 4096 // its end wraps to 12 KiB
	if _, err := transfer.NewOwed(dst, transfer.Source{}, fx.slab, bad); !errors.Is(err, transfer.ErrOwed) {
		t.Fatalf("a chunk whose end wraps: %v", err)
	}
}

// A peer that answers a range with its headers and then stalls is given
// up on at RangeTimeout, whatever the caller's context (seen failing
// first: the read waited on the stalled body).
func TestReadRangeStalled(t *testing.T) {
	fx := newSlab(t)
	c := fx.chunks[0]
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", c.Offset, c.Offset+c.Size-1, fx.slab.Size))
		w.Header().Set("Content-Length", fmt.Sprint(c.Size))
		w.WriteHeader(http.StatusPartialContent)
		w.(http.Flusher).Flush()
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(stop)
	was := transfer.RangeTimeout
	transfer.RangeTimeout = 200 * time.Millisecond
	defer func() { transfer.RangeTimeout = was }()
	got := make(chan error, 1)
	go func() {
		_, err := transfer.ReadRange(context.Background(), transfer.Source{Client: srv.Client(), Base: srv.URL},
			transfer.Range{Object: fx.slab.Address, Offset: c.Offset, Size: c.Size, Sum: c.Address})
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, transfer.ErrTruncated) {
			// A caller tells a stalled source from a link that failed
			// at once (member.Lent: a stall is not tried again).
			t.Fatalf("a stalled range read: %v, want ErrTruncated and the deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stalled range still waited on after 10 s")
	}
}
