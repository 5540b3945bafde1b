package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestPutAndRead(t *testing.T) {
	s := mustStore(t)
	a := put(t, s, "hello")
	if a != record.Sum([]byte("hello")) {
		t.Fatal("address is not the BLAKE3 of the bytes")
	}
	text := a.String()[len(record.AddressPrefix):]
	if want := s.Dir() + "/objects/" + text[:1] + "/" + text; s.Path(a) != want {
		t.Fatalf("path %s, want %s", s.Path(a), want)
	}
	if info, err := os.Stat(s.Path(a)); err != nil || info.Mode().Perm() != 0o400 {
		t.Fatalf("object file: %v %v", info.Mode(), err)
	}
	if b := put(t, s, "hello"); b != a {
		t.Fatal("same bytes, other address")
	}
	if got, err := s.ReadAll(a); err != nil || string(got) != "hello" {
		t.Fatalf("%q %v", got, err)
	}
	r, err := s.Open(a)
	if err != nil || r.Size() != 5 {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, r); err != nil || buf.String() != "hello" {
		t.Fatalf("io.Copy: %q %v", buf.String(), err)
	}
	r.Close()
	if err := s.Verify(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	empty := put(t, s, "")
	if got, err := s.ReadAll(empty); err != nil || len(got) != 0 {
		t.Fatalf("empty object: %v", err)
	}
	absent := record.Sum([]byte("never"))
	for name, err := range map[string]error{
		"read":   func() error { _, err := s.ReadAll(absent); return err }(),
		"verify": s.Verify(t.Context(), absent),
		"size":   func() error { _, err := s.Size(absent); return err }(),
	} {
		if !errors.Is(err, ErrMissingObject) || !strings.Contains(err.Error(), absent.String()) {
			t.Errorf("%s of a missing object: %v", name, err)
		}
	}
}

// A bit flip on disk is ErrCorrupt naming the address, on every verified
// read path.
func TestBitFlipIsCorrupt(t *testing.T) {
	s := mustStore(t)
	content := bytes.Repeat([]byte("0123456789abcdef"), 300000) // several buffers
	a, err := s.PutBytes(content)
	if err != nil {
		t.Fatal(err)
	}
	for _, edit := range []func([]byte) []byte{
		flipByte(0), flipByte(len(content) / 2), flipByte(len(content) - 1),
		func(b []byte) []byte { return b[:len(b)-1] },      // truncated
		func(b []byte) []byte { return append(b, 'x') },    // extended
		func(b []byte) []byte { return []byte("another") }, // replaced
	} {
		damage(t, s, a, edit)
		check := func(name string, err error) {
			t.Helper()
			var ce *CorruptError
			if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) || ce.Address != a || !strings.Contains(err.Error(), a.String()) {
				t.Errorf("%s: %v", name, err)
			}
		}
		_, err := s.ReadAll(a)
		check("ReadAll", err)
		check("Verify", s.Verify(t.Context(), a))
		r, _ := s.Open(a)
		_, err = io.Copy(io.Discard, r)
		check("io.Copy", err)
		r.Close()
		r, _ = s.Open(a)
		_, err = io.ReadAll(struct{ io.Reader }{r}) // through Read alone
		check("Read", err)
		r.Close()
		damage(t, s, a, func([]byte) []byte { return slices.Clone(content) })
	}
	if err := s.Verify(t.Context(), a); err != nil {
		t.Fatal(err)
	}
}

// patternReader yields n bytes that depend on their offset only: a
// repeating block whose length is prime to every buffer size.
type patternReader struct{ n, off int64 }

var pattern = func() []byte {
	b := make([]byte, 1<<16+1)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	return b
}()

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	for done := 0; done < len(b); {
		done += copy(b[done:], pattern[(p.off+int64(done))%int64(len(pattern)):])
	}
	p.off += int64(len(b))
	return len(b), nil
}

// A large object is streamed: putting and verifying 256 MiB allocates a
// small fraction of it (the stream buffer, and the hasher's garbage).
func TestLargeObjectStreamed(t *testing.T) {
	s := mustStore(t)
	const n = 256 << 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	a, err := s.Put(t.Context(), &patternReader{n: n})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > n/4 {
		t.Fatalf("put and verify of %d MiB allocated %d MiB", n>>20, alloc>>20)
	}
	if sz, _ := s.Size(a); sz != n {
		t.Fatalf("size %d", sz)
	}
	want := record.Address{}
	h := newHasher()
	io.Copy(h, &patternReader{n: n})
	h.Sum(want[:0])
	if a != want {
		t.Fatal("streamed address differs")
	}
}

func TestPutCancelled(t *testing.T) {
	s := mustStore(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Put(ctx, &patternReader{n: 4 << 20}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled put: %v", err)
	}
	if tmp, _ := os.ReadDir(s.Dir() + "/objects/tmp"); len(tmp) != 0 {
		t.Fatalf("cancelled put left %d temporary files", len(tmp))
	}
}

func TestRefs(t *testing.T) {
	s := mustStore(t)
	receipt, journal := put(t, s, "receipt"), put(t, s, "journal")
	att := put(t, s, "attestation", receipt, journal)
	if refs, err := s.Refs(att); err != nil || !slices.Equal(refs, []record.Address{receipt, journal}) {
		t.Fatalf("refs %v %v", refs, err)
	}
	// Putting it again adds to its refs, never drops one.
	extra := put(t, s, "extra")
	put(t, s, "attestation", journal, extra)
	if refs, _ := s.Refs(att); !slices.Equal(refs, []record.Address{receipt, journal, extra}) {
		t.Fatalf("refs after re-put %v", refs)
	}
	if _, err := s.PutBytes([]byte("x"), record.Sum([]byte("never"))); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("ref to a missing object: %v", err)
	}
	if s.Has(record.Sum([]byte("x"))) {
		t.Fatal("refused put stored the object")
	}
	if refs, err := s.Refs(receipt); err != nil || len(refs) != 0 {
		t.Fatalf("refs of a leaf: %v %v", refs, err)
	}
}

// Path is objects/<c>/<text>: the address's text without "b3:", under its
// first character.
func TestPathIsTheAddressText(t *testing.T) {
	s := mustStore(t)
	for i := range 1000 {
		a := record.Sum(fmt.Appendf(nil, "object %d", i))
		text := strings.TrimPrefix(a.String(), record.AddressPrefix)
		if got, want := s.Path(a), filepath.Join(s.objects, text[:1], text); got != want {
			t.Fatalf("%s: %q, want %q", a, got, want)
		}
	}
}

// Touch gives each object the time of a put now, so that a collection's
// grace keeps it; an object the store lacks is ErrMissingObject.
func TestTouch(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	a, err := s.PutBytes([]byte("kept a while"))
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(s.Path(a), old, old); err != nil {
		t.Fatal(err)
	}
	if err := s.Touch(a); err != nil {
		t.Fatal(err)
	}
	if st, err := s.GC(t.Context(), time.Hour); err != nil || st.Removed != 0 || !s.Has(a) {
		t.Fatalf("a touched object collected: %+v, %v", st, err)
	}
	if err := s.Touch(record.Sum([]byte("never put"))); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("Touch of an object not held: %v", err)
	}
}
