package pageserver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// owedFixture is newFixture with its two chunks owed: their files hold
// zeros until the daemon's Fetch (fetch) writes them. Its server asks
// the daemon's side (serveFetches) over a socket pair.
func owedFixture(t *testing.T, fetch func(Extent) error) (fixture, *Server) {
	f := newFixture(t)
	for i := range 2 {
		e := &f.m.Tasks[0].Extents[i]
		e.Owed = true
		if err := os.Chmod(e.Path, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(e.Path, make([]byte, e.Size), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f.m.Fetch = func(_ context.Context, e Extent) error { return fetch(e) }
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "fetches"), os.NewFile(uintptr(fds[1]), "fetch")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveFetches(ctx, f.m, ours)
	}()
	t.Cleanup(func() {
		theirs.Close()
		<-done
		cancel()
		ours.Close()
	})
	// The server decodes its own copy of the table, as its process does.
	s := New(f.m)
	s.FetchFrom(theirs)
	return f, s
}

// An owed chunk is read only once the daemon fetched it, each asked once;
// the whole file, not owed, is never asked for.
func TestServeFetchesOwedChunks(t *testing.T) {
	var mu sync.Mutex
	var asked []uint64
	var f fixture
	f, s := owedFixture(t, func(e Extent) error {
		mu.Lock()
		asked = append(asked, e.Vaddr)
		mu.Unlock()
		b := f.chunk1
		if e.Vaddr == 0x12000 {
			b = f.chunk2
		}
		return os.WriteFile(e.Path, b, 0o600)
	})
	c, done, _ := serveWith(t, s)
	for range 2 {
		got, err := c.get(8, 0x10000, 7)
		if err != nil {
			t.Fatal(err)
		}
		if want := append(append([]byte{}, f.chunk1...), f.chunk2...); !slices.Equal(got, want) {
			t.Fatalf("served %d bytes, not the fetched chunks", len(got))
		}
	}
	if _, err := c.get(3, 0x20000, 7); err != nil {
		t.Fatal(err)
	}
	c.conn.Close()
	<-done
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(asked)
	if !slices.Equal(asked, []uint64{0x10000, 0x12000}) {
		t.Fatalf("asked for %#x, want each owed chunk once", asked)
	}
}

// A chunk the daemon did not fetch is not served: not read, not hashed,
// and the serve fails with ErrNotFetched.
func TestServeOwedChunkNotFetched(t *testing.T) {
	f, s := owedFixture(t, func(Extent) error { return errors.New("the source is gone") })
	c, done, _ := serveWith(t, s)
	if got, err := c.get(1, 0x10000, 7); err == nil {
		t.Fatalf("served %d bytes of a chunk not fetched", len(got))
	}
	if err := <-done; !errors.Is(err, ErrNotFetched) {
		t.Fatalf("serve: %v, want ErrNotFetched", err)
	}
	if b, err := os.ReadFile(f.m.Tasks[0].Extents[0].Path); err != nil || slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
		t.Fatalf("the chunk's file was written: %v", err)
	}
}

// A daemon that hangs up fails every fetch: the serve ends, nothing of
// the owed chunk is sent.
func TestServeFetchDaemonGone(t *testing.T) {
	f := newFixture(t)
	f.m.Tasks[0].Extents[0].Owed = true
	a, b := net.Pipe()
	s := New(f.m)
	s.FetchFrom(b)
	a.Close() // the daemon's end
	c, done, _ := serveWith(t, s)
	if got, err := c.get(1, 0x10000, 7); err == nil {
		t.Fatalf("served %d bytes with no daemon to fetch them", len(got))
	}
	if err := <-done; !errors.Is(err, ErrNotFetched) {
		t.Fatalf("serve: %v, want ErrNotFetched", err)
	}
}

// An owed extent survives the table's encoding; one not verified is
// refused.
func TestTableOwed(t *testing.T) {
	f := newFixture(t)
	f.m.Tasks[0].Extents[1].Owed = true
	var b bytes.Buffer
	if err := f.m.Encode(&b); err != nil {
		t.Fatal(err)
	}
	m, err := Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if got := []bool{m.Tasks[0].Extents[0].Owed, m.Tasks[0].Extents[1].Owed, m.Tasks[0].Extents[2].Owed}; !slices.Equal(got, []bool{false, true, false}) {
		t.Fatalf("owed after decoding: %v", got)
	}
	f.m.Tasks[0].Extents[2].Owed = true
	if err := f.m.Check(); !errors.Is(err, ErrTable) {
		t.Fatalf("an owed extent not verified: %v, want ErrTable", err)
	}
}

// A serve lazy-pages ends (its close) while a chunk read ahead waits for
// its fetch returns at once: lazy-pages may never ask for that chunk, and
// a page server that outstays lazy-pages is killed, its restore counted
// lost. Seen failing first: Serve waited for the fetch.
func TestServeCloseEndsFetchesAhead(t *testing.T) {
	blocked := make(chan struct{})
	var f fixture
	f, s := owedFixture(t, func(e Extent) error {
		if e.Vaddr != 0x10000 {
			<-blocked // the chunk read ahead: its source stalls
			return errors.New("stalled")
		}
		return os.WriteFile(e.Path, f.chunk1, 0o600)
	})
	t.Cleanup(func() { close(blocked) }) // before the fixture's own
	c, done, _ := serveWith(t, s)
	if _, err := c.get(2, 0x10000, 7); err != nil { // more than a page: reads ahead
		t.Fatal(err)
	}
	if _, err := c.conn.Write(header(cmdClose, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	var status [4]byte
	if _, err := io.ReadFull(c.conn, status[:]); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the serve still waits 5 s after lazy-pages closed, for a fetch read ahead")
	}
}
