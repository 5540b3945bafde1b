package pageserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/runrecordd/runrecordd/pkg/record"
	"golang.org/x/sys/unix"
)

// pages is n pages of bytes that differ page to page (seed picks them).
func pages(n int, seed byte) []byte {
	b := make([]byte, n*PageSize)
	for i := range b {
		b[i] = seed + byte(i/PageSize) + byte(i%251)
	}
	return b
}

// fixture is a task 7 of three extents: two verified chunks at 0x10000
// (2 pages) and 0x12000 (1 page), a gap, then 3 pages of a whole file at
// offset 4096 from 0x20000.
type fixture struct {
	m                  *Table
	chunk1, chunk2     []byte
	whole              []byte
	chunk1Path, wholeP string
}

func newFixture(t *testing.T) fixture {
	dir := t.TempDir()
	f := fixture{chunk1: pages(2, 1), chunk2: pages(1, 50), whole: pages(4, 90)}
	f.chunk1Path = filepath.Join(dir, "c1")
	c2 := filepath.Join(dir, "c2")
	f.wholeP = filepath.Join(dir, "whole")
	for p, b := range map[string][]byte{f.chunk1Path: f.chunk1, c2: f.chunk2, f.wholeP: f.whole} {
		if err := os.WriteFile(p, b, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	a1, a2 := record.Sum(f.chunk1), record.Sum(f.chunk2)
	f.m = &Table{Tasks: []Task{{ID: 7, Extents: []Extent{
		{Vaddr: 0x10000, Size: 2 * PageSize, Path: f.chunk1Path, Verify: &a1},
		{Vaddr: 0x12000, Size: PageSize, Path: c2, Verify: &a2},
		{Vaddr: 0x20000, Size: 3 * PageSize, Path: f.wholeP, Offset: PageSize},
	}}}}
	return f
}

// client is lazy-pages' side of the protocol.
type client struct {
	t    *testing.T
	conn net.Conn
}

func header(cmd uint32, n, vaddr, dst uint64) []byte {
	h := make([]byte, headerSize)
	binary.NativeEndian.PutUint32(h, cmd)
	binary.NativeEndian.PutUint64(h[8:], n)
	binary.NativeEndian.PutUint64(h[16:], vaddr)
	binary.NativeEndian.PutUint64(h[24:], dst)
	return h
}

// get asks n pages at vaddr of task dst and returns the pages the reply
// holds, checking that its header echoes the request.
func (c client) get(n, vaddr, dst uint64) ([]byte, error) {
	if _, err := c.conn.Write(header(cmdGet, n, vaddr, dst)); err != nil {
		return nil, err
	}
	h := make([]byte, headerSize)
	if _, err := io.ReadFull(c.conn, h); err != nil {
		return nil, err
	}
	sent := binary.NativeEndian.Uint64(h[8:])
	if binary.NativeEndian.Uint32(h) != cmdAdd || binary.NativeEndian.Uint64(h[16:]) != vaddr || binary.NativeEndian.Uint64(h[24:]) != dst || sent == 0 || sent > n {
		c.t.Fatalf("reply header %x to %d pages at %#x of %d", h, n, vaddr, dst)
	}
	b := make([]byte, sent*PageSize)
	_, err := io.ReadFull(c.conn, b)
	return b, err
}

// serve runs a server of m on one end of a pipe; the result arrives on
// the channel once it returns (and its end is closed).
func serve(t *testing.T, m *Table) (client, <-chan error, *Server) {
	return serveWith(t, New(m))
}

// serveWith is serve of the server s.
func serveWith(t *testing.T, s *Server) (client, <-chan error, *Server) {
	a, b := net.Pipe()
	return serveOn(t, s, a, b)
}

// serveOn is serveWith over a given connection: the server's end b, the
// client's a.
func serveOn(t *testing.T, s *Server, a net.Conn, b io.ReadWriteCloser) (client, <-chan error, *Server) {
	done := make(chan error, 1)
	go func() {
		err := s.Serve(b)
		b.Close()
		done <- err
	}()
	t.Cleanup(func() { a.Close() })
	return client{t, a}, done, s
}

// serveSocket is serve over a socket pair, as lazy-pages connects: the
// server writes each reply with writev.
func serveSocket(t *testing.T, m *Table) (client, <-chan error, *Server) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cf := os.NewFile(uintptr(fds[0]), "lazy-pages")
	defer cf.Close()
	a, err := net.FileConn(cf)
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, New(m), a, os.NewFile(uintptr(fds[1]), "page server"))
}

func TestServe(t *testing.T) {
	t.Run("pipe", func(t *testing.T) { testServe(t, serve, true) })
	t.Run("socket", func(t *testing.T) { testServe(t, serveSocket, false) })
}

// testServe is TestServe over a connection made by serve; midway is
// whether the connection orders the server's steps before the client's
// reads (a net.Pipe does, as the race detector sees it; a socket's
// kernel buffer does not), so its stats may be read between requests.
func testServe(t *testing.T, serve func(*testing.T, *Table) (client, <-chan error, *Server), midway bool) {
	f := newFixture(t)
	c, done, s := serve(t, f.m)
	for _, tc := range []struct {
		name         string
		n, vaddr     uint64
		want         []byte
		wantVerified int
	}{
		{"inside the first chunk", 1, 0x11000, f.chunk1[PageSize:], 1},
		{"across both chunks, then stops at the gap", 8, 0x10000, append(append([]byte{}, f.chunk1...), f.chunk2...), 2},
		{"the whole file from its offset", 3, 0x20000, f.whole[PageSize:], 2},
		{"fewer than the extent holds", 1, 0x21000, f.whole[2*PageSize : 3*PageSize], 2},
	} {
		got, err := c.get(tc.n, tc.vaddr, 7)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(got, tc.want) {
			t.Fatalf("%s: %d bytes, not the %d expected", tc.name, len(got), len(tc.want))
		}
		if midway && s.stats.Verified != tc.wantVerified {
			t.Fatalf("%s: %d chunks verified, want %d", tc.name, s.stats.Verified, tc.wantVerified)
		}
	}
	if _, err := c.conn.Write(header(cmdForce, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	var status [4]byte
	if _, err := io.ReadFull(c.conn, status[:]); err != nil || status != [4]byte{} {
		t.Fatalf("close answered %x, %v", status, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if st := s.Stats(); st.Requests != 4 || st.Pages != 1+3+3+1 {
		t.Fatalf("stats %+v", st)
	}
}

// A chunk whose bytes changed after the listing was made is not served:
// not its first page, not any page of it.
func TestServeRefusesAChangedChunk(t *testing.T) {
	f := newFixture(t)
	b := append([]byte{}, f.chunk1...)
	b[len(b)-1] ^= 1 // the last page: the first is refused too
	if err := os.Chmod(f.chunk1Path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.chunk1Path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c, done, _ := serve(t, f.m)
	if got, err := c.get(1, 0x10000, 7); err == nil {
		t.Fatalf("served %d bytes of a changed chunk", len(got))
	}
	if err := <-done; !errors.Is(err, ErrRefused) {
		t.Fatalf("serve: %v, want ErrRefused", err)
	}
	// Short too: a chunk cut after it was listed.
	if err := os.WriteFile(f.chunk1Path, f.chunk1[:PageSize], 0o600); err != nil {
		t.Fatal(err)
	}
	c, done, _ = serve(t, f.m)
	if _, err := c.get(1, 0x10000, 7); err == nil {
		t.Fatal("served a chunk cut short")
	}
	if err := <-done; !errors.Is(err, ErrRefused) {
		t.Fatalf("serve: %v, want ErrRefused", err)
	}
}

func TestServeRefusesRequests(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  []byte
	}{
		{"an unknown task", header(cmdGet, 1, 0x10000, 8)},
		{"an address in the gap", header(cmdGet, 1, 0x13000, 7)},
		{"an address past every extent", header(cmdGet, 1, 0x30000, 7)},
		{"an address below every extent", header(cmdGet, 1, 0x1000, 7)},
		{"zero pages", header(cmdGet, 0, 0x10000, 7)},
		{"an address inside a page", header(cmdGet, 1, 0x10010, 7)},
		{"another command", header(cmdAdd, 1, 0x10000, 7)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, done, _ := serve(t, newFixture(t).m)
			if _, err := c.conn.Write(tc.req); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, ErrRequest) {
				t.Fatalf("serve: %v, want ErrRequest", err)
			}
			if n, err := c.conn.Read(make([]byte, 1)); err == nil {
				t.Fatalf("a reply of %d bytes after a refusal", n)
			}
		})
	}
}

// Requests sent while a reply is still being written are read, not left
// to fill the socket: lazy-pages sends without waiting.
func TestServeReadsAhead(t *testing.T) {
	f := newFixture(t)
	c, done, _ := serve(t, f.m)
	const n = 200
	for range n {
		if _, err := c.conn.Write(header(cmdGet, 3, 0x20000, 7)); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		h := make([]byte, headerSize+3*PageSize)
		if _, err := io.ReadFull(c.conn, h); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(h[headerSize:], f.whole[PageSize:]) {
			t.Fatal("wrong pages")
		}
	}
	c.conn.Close()
	if err := <-done; !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("serve after a hang-up: %v", err)
	}
}

// A background request (more than one page) has the chunks after it read
// and verified ahead, within aheadBytes; a chunk read ahead that is never
// asked for is no error, even when it is not the one listed; one asked
// for is served from what was read ahead, once.
func TestServeReadsChunksAhead(t *testing.T) {
	dir := t.TempDir()
	const n = 40
	m := &Table{Tasks: []Task{{ID: 1}}}
	var all []byte
	for i := range n {
		b := pages(1, byte(i))
		p := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(p, b, 0o400); err != nil {
			t.Fatal(err)
		}
		a := record.Sum(b)
		if i == n-1 {
			a[0] ^= 1 // the last chunk is not the one listed
		}
		m.Tasks[0].Extents = append(m.Tasks[0].Extents, Extent{Vaddr: uint64(i) * PageSize, Size: PageSize, Path: p, Verify: &a})
		all = append(all, b...)
	}
	c, done, s := serve(t, m)
	got, err := c.get(2, 0, 1)
	if err != nil || !bytes.Equal(got, all[:2*PageSize]) {
		t.Fatalf("served %d bytes, %v", len(got), err)
	}
	// The reply is written after the read-ahead was queued.
	got, err = c.get(10, 2*PageSize, 1)
	if err != nil || !bytes.Equal(got, all[2*PageSize:12*PageSize]) {
		t.Fatalf("served %d bytes, %v", len(got), err)
	}
	c.conn.Write(header(cmdForce, 0, 0, 0))
	io.ReadFull(c.conn, make([]byte, 4))
	if err := <-done; err != nil {
		t.Fatalf("serve: %v (a chunk read ahead and never asked for failed it)", err)
	}
	if st := s.Stats(); st.Verified != 12 {
		t.Fatalf("%d chunks verified, want the 12 served", st.Verified)
	}
	if len(s.ahead.slots) != n-12 || s.ahead.bytes[&m.Tasks[0]] != (n-12)*PageSize || s.ahead.cursor[&m.Tasks[0]] != n {
		t.Fatalf("%d chunks (%d bytes) read ahead and not asked for, cursor %d; want the %d after the 12 served",
			len(s.ahead.slots), s.ahead.bytes[&m.Tasks[0]], s.ahead.cursor[&m.Tasks[0]], n-12)
	}
}

// serveHeld is serve with the server told whether the unit's
// userfaultfds are held through the returned pipe's write end.
func serveHeld(t *testing.T, m *Table) (client, <-chan error, *os.File, *Server) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	s := New(m)
	s.Hold(r)
	c, done, _ := serveWith(t, s)
	return c, done, w, s
}

// silent reports whether nothing arrives on c, not even its end, within
// a while.
func (c client) silent() bool {
	c.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	defer c.conn.SetReadDeadline(time.Time{})
	_, err := c.conn.Read(make([]byte, 1))
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// Pages go out before the daemon's word (a restore can fault before it
// returns, and the daemon takes the copies after), but a failure waits
// for it: were the server to hang up before the copies are held,
// lazy-pages would exit and the unit read zeros where its pages were.
// Held, a refusal hangs up.
func TestServeFailureWaitsForHeld(t *testing.T) {
	f := newFixture(t)
	c, done, held, _ := serveHeld(t, f.m)
	if got, err := c.get(3, 0x20000, 7); err != nil || !bytes.Equal(got, f.whole[PageSize:]) {
		t.Fatalf("served %d bytes before the word, %v", len(got), err)
	}
	if _, err := c.conn.Write(header(cmdGet, 1, 0x13000, 7)); err != nil {
		t.Fatal(err)
	}
	if !c.silent() {
		t.Fatal("a reply, or a hang-up, to a failed request before the word")
	}
	if _, err := held.Write([]byte{HeldByte}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrRequest) {
		t.Fatalf("serve: %v, want ErrRequest", err)
	}
}

// The word taken back (the daemon let the copies go, or ended): a
// refusal keeps the connection, as when it was never given.
func TestServeHeldThenLetGo(t *testing.T) {
	f := newFixture(t)
	c, done, held, s := serveHeld(t, f.m)
	if _, err := held.Write([]byte{HeldByte}); err != nil {
		t.Fatal(err)
	}
	held.Close()
	<-s.holds.said
	for s.holds.held.Load() { // until the word's end is read
		time.Sleep(time.Millisecond)
	}
	if _, err := c.conn.Write(header(cmdGet, 1, 0x13000, 7)); err != nil {
		t.Fatal(err)
	}
	if !c.silent() {
		t.Fatal("a hang-up after the copies were let go")
	}
	c.conn.Close()
	if err := <-done; !errors.Is(err, ErrRequest) {
		t.Fatalf("serve: %v, want ErrRequest", err)
	}
}

// Not held, an unknown command (which ends the request reader) does not
// hang up either.
func TestServeUnheldUnknownCommand(t *testing.T) {
	c, done, held, _ := serveHeld(t, newFixture(t).m)
	held.Close()
	if _, err := c.conn.Write(header(cmdAdd, 1, 0x10000, 7)); err != nil {
		t.Fatal(err)
	}
	if !c.silent() {
		t.Fatal("a hang-up after an unknown command, nobody holding the userfaultfds")
	}
	c.conn.Close()
	if err := <-done; !errors.Is(err, ErrRequest) {
		t.Fatalf("serve: %v, want ErrRequest", err)
	}
}

// Told that nobody holds the userfaultfds (the daemon ended first), the
// server serves, and a refused chunk is not served but the connection is
// kept: lazy-pages waits, the unit's fault with it, until lazy-pages
// hangs up (the unit killed).
func TestServeRefusalUnheld(t *testing.T) {
	f := newFixture(t)
	b := append([]byte{}, f.chunk1...)
	b[0] ^= 1
	if err := os.Chmod(f.chunk1Path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.chunk1Path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c, done, held, _ := serveHeld(t, f.m)
	held.Close()
	if got, err := c.get(1, 0x20000, 7); err != nil || !bytes.Equal(got, f.whole[PageSize:2*PageSize]) {
		t.Fatalf("served %d bytes, %v", len(got), err)
	}
	if _, err := c.conn.Write(header(cmdGet, 1, 0x10000, 7)); err != nil {
		t.Fatal(err)
	}
	if !c.silent() {
		t.Fatal("a reply, or a hang-up, after a refusal with nobody holding the userfaultfds")
	}
	select {
	case err := <-done:
		t.Fatalf("serve returned %v while lazy-pages was connected", err)
	default:
	}
	c.conn.Close()
	if err := <-done; !errors.Is(err, ErrRefused) {
		t.Fatalf("serve: %v, want ErrRefused", err)
	}
}

// A verified chunk's pages sent in two requests are the bytes that were
// verified: a change to its file after the first is not served — kept
// from the first read, or refused when read again.
func TestServeSendsOnlyVerifiedBytes(t *testing.T) {
	for _, keep := range []uint64{keepBytes, 0} {
		f := newFixture(t)
		c, done, s := serve(t, f.m)
		s.keepMax = keep
		if got, err := c.get(1, 0x10000, 7); err != nil || !bytes.Equal(got, f.chunk1[:PageSize]) {
			t.Fatalf("served %d bytes, %v", len(got), err)
		}
		b := append([]byte{}, f.chunk1...)
		b[PageSize] ^= 1
		if err := os.Chmod(f.chunk1Path, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.chunk1Path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := c.get(1, 0x11000, 7)
		if keep == 0 {
			if err == nil {
				t.Fatalf("keeping nothing: served %x… of a changed chunk", got[:8])
			}
			if err := <-done; !errors.Is(err, ErrRefused) {
				t.Fatalf("serve: %v, want ErrRefused", err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, f.chunk1[PageSize:]) {
			t.Fatalf("the second page: %v (changed bytes served: %v)", err, bytes.Equal(got, b[PageSize:]))
		}
		if len(s.kept) != 0 || s.keptBytes != 0 {
			t.Fatalf("%d chunks, %d bytes kept after every page of them went", len(s.kept), s.keptBytes)
		}
	}
}

// Each task reads ahead within its share: chunks read ahead for a task
// that is never asked again (it exited) leave the others theirs.
func TestServeReadsAheadPerTask(t *testing.T) {
	dir := t.TempDir()
	m := &Table{}
	for id := range uint64(2) {
		task := Task{ID: id + 1}
		for i := range 40 {
			b := pages(MaxExtentSize/PageSize, byte(i)+byte(id))
			p := filepath.Join(dir, strconv.Itoa(int(id))+"-"+strconv.Itoa(i))
			if err := os.WriteFile(p, b, 0o400); err != nil {
				t.Fatal(err)
			}
			a := record.Sum(b)
			task.Extents = append(task.Extents, Extent{Vaddr: uint64(i) * MaxExtentSize, Size: MaxExtentSize, Path: p, Verify: &a})
		}
		m.Tasks = append(m.Tasks, task)
	}
	c, done, s := serve(t, m)
	for _, id := range []uint64{1, 2} {
		if _, err := c.get(2, 0, id); err != nil {
			t.Fatal(err)
		}
	}
	c.conn.Write(header(cmdForce, 0, 0, 0))
	io.ReadFull(c.conn, make([]byte, 4))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := range m.Tasks {
		if got := s.ahead.bytes[&m.Tasks[i]]; got != aheadBytes/2 {
			t.Fatalf("task %d: %d bytes read ahead, want its share %d", m.Tasks[i].ID, got, aheadBytes/2)
		}
	}
}

// A chunk is read and verified whether the page cache holds it or not
// (then past the cache, with O_DIRECT where the filesystem allows).
func TestLoadChunkCachedOrNot(t *testing.T) {
	b := pages(5, 9)
	p := filepath.Join(t.TempDir(), "c")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	a := record.Sum(b)
	e := &Extent{Vaddr: 0x10000, Size: uint64(len(b)), Path: p, Verify: &a}
	for _, cached := range []bool{true, false} {
		if !cached {
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			f.Sync()
			unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
			f.Close()
		}
		d := &dirs{}
		got, err := loadChunk(e, d)
		d.close()
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("cached %v: %d bytes, %v", cached, len(got), err)
		}
	}
	bad := *e
	z := record.Sum(nil)
	bad.Verify = &z
	d := &dirs{}
	defer d.close()
	if _, err := loadChunk(&bad, d); !errors.Is(err, ErrRefused) {
		t.Fatalf("a chunk listed under another address: %v", err)
	}
}

// A batch of chunks is read as loadChunk reads one: those the page cache
// does not hold past it, in one batch of asynchronous reads (they stay out
// of the cache), the others from it; a chunk cut, missing or not the one
// listed fails alone.
func TestLoadChunksBatch(t *testing.T) {
	r, err := newAIO()
	if err != nil {
		t.Fatalf("this kernel has AIO: %v", err)
	}
	defer r.close()
	dir := t.TempDir()
	var slots []*slot
	var want [][]byte
	for i := range 40 {
		b := pages(4, byte(i))
		p := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		a := record.Sum(b)
		if i%7 != 0 {
			uncache(t, p)
		}
		slots = append(slots, &slot{e: &Extent{Vaddr: uint64(i) << 20, Size: uint64(len(b)), Path: p, Verify: &a}, done: make(chan struct{})})
		want = append(want, b)
	}
	other := record.Sum(nil)
	slots[3].e.Verify = &other  // not the one listed
	slots[5].e.Path += ".gone"  // missing
	slots[9].e.Size += PageSize // cut
	d := &dirs{}
	defer d.close()
	loadChunks(slots, d, r)
	for i, sl := range slots {
		select {
		case <-sl.done:
		default:
			t.Fatalf("chunk %d: loaded and not said", i)
		}
		switch i {
		case 3, 9:
			if !errors.Is(sl.err, ErrRefused) {
				t.Errorf("chunk %d: %v, want ErrRefused", i, sl.err)
			}
		case 5:
			if !errors.Is(sl.err, os.ErrNotExist) {
				t.Errorf("chunk %d: %v, want ErrNotExist", i, sl.err)
			}
		default:
			if sl.err != nil || !bytes.Equal(sl.b, want[i]) {
				t.Errorf("chunk %d: %d bytes, %v", i, len(sl.b), sl.err)
			}
			if i%7 != 0 && inCache(t, sl.e.Path) {
				t.Errorf("chunk %d was read through the page cache", i)
			}
		}
	}
}

// uncache writes file p back and drops it from the page cache.
func uncache(t testing.TB, p string) {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if inCache(t, p) {
		t.Fatalf("%s cannot be dropped from the page cache (a tmpfs? set TMPDIR to a disk)", p)
	}
}

// inCache is whether the page cache holds any of file p.
func inCache(t testing.TB, p string) bool {
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{}, &cs, 0); err != nil {
		t.Fatal(err)
	}
	return cs.Cache > 0
}

// iocb and ioEvent have the kernel's sizes.
func TestAIOLayout(t *testing.T) {
	if n := unsafe.Sizeof(iocb{}); n != 64 {
		t.Errorf("iocb is %d bytes, the kernel's 64", n)
	}
	if n := unsafe.Sizeof(ioEvent{}); n != 32 {
		t.Errorf("ioEvent is %d bytes, the kernel's 32", n)
	}
}

// A read into several buffers is one asynchronous read of the file's
// range, past the page cache, its bytes in the buffers in order.
func TestAIOReadScattered(t *testing.T) {
	r, err := newAIO()
	if err != nil {
		t.Fatalf("this kernel has AIO: %v", err)
	}
	defer r.close()
	b := pages(12, 7)
	p := filepath.Join(t.TempDir(), "slab")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	uncache(t, p)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	rs := []aioRead{
		{fd: fd, off: PageSize, bufs: [][]byte{aligned(2 * PageSize), aligned(PageSize), aligned(4 * PageSize)}},
		{fd: fd, off: 8 * PageSize, bufs: [][]byte{aligned(PageSize)}},
	}
	ended := 0
	r.read(rs, func(i, count int, err error) {
		ended++
		want := b[rs[i].off : int(rs[i].off)+len(bytes.Join(rs[i].bufs, nil))]
		if err != nil || count != len(want) || !bytes.Equal(bytes.Join(rs[i].bufs, nil), want) {
			t.Errorf("read %d: %d bytes, %v", i, count, err)
		}
	})
	if ended != len(rs) || inCache(t, p) {
		t.Errorf("%d of %d reads ended; through the page cache: %v", ended, len(rs), inCache(t, p))
	}
}

// A verified extent may be a chunk's range of a larger file (a slab): read
// at its offset, alone or in a batch, from the page cache or past it, and
// hashed as a chunk's own file is; a range the file does not hold, or
// bytes that are not the listed ones, are refused.
func TestLoadChunkInSlab(t *testing.T) {
	r, err := newAIO()
	if err != nil {
		t.Fatalf("this kernel has AIO: %v", err)
	}
	defer r.close()
	parts := [][]byte{pages(2, 1), pages(1, 2), pages(3, 3)}
	p := filepath.Join(t.TempDir(), "slab")
	if err := os.WriteFile(p, bytes.Join(parts, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cached := range []bool{true, false} {
		var slots []*slot
		var off uint64
		for i, b := range parts {
			a := record.Sum(b)
			slots = append(slots, &slot{e: &Extent{Vaddr: uint64(i) << 20, Size: uint64(len(b)), Path: p, Offset: off, Verify: &a}, done: make(chan struct{})})
			off += uint64(len(b))
		}
		if !cached {
			uncache(t, p)
		}
		d := &dirs{}
		for i, sl := range slots {
			if got, err := loadChunk(sl.e, d); err != nil || !bytes.Equal(got, parts[i]) {
				t.Fatalf("cached %v: chunk %d alone: %d bytes, %v", cached, i, len(got), err)
			}
		}
		if !cached {
			uncache(t, p)
		}
		other := record.Sum(parts[0])
		slots[1].e.Verify = &other    // the bytes of another chunk's range
		slots[2].e.Offset += PageSize // past the slab's end
		loadChunks(slots, d, r)
		d.close()
		if slots[0].err != nil || !bytes.Equal(slots[0].b, parts[0]) {
			t.Fatalf("cached %v: chunk 0 in a batch: %d bytes, %v", cached, len(slots[0].b), slots[0].err)
		}
		for _, i := range []int{1, 2} {
			if !errors.Is(slots[i].err, ErrRefused) {
				t.Fatalf("cached %v: chunk %d: %v, want ErrRefused", cached, i, slots[i].err)
			}
		}
	}
}

// A batch of a slab's chunks is read past the page cache, the chunks next
// to each other in one read: each is hashed alone, so a chunk that is not
// the one listed, or lies past the slab's end, is refused alone, and the
// chunks on either side of it, or of a gap, are loaded.
func TestLoadChunksSlabRuns(t *testing.T) {
	r, err := newAIO()
	if err != nil {
		t.Fatalf("this kernel has AIO: %v", err)
	}
	defer r.close()
	const n = aioBatch + 8
	var parts [][]byte
	for i := range n {
		parts = append(parts, pages(4, byte(i)))
	}
	p := filepath.Join(t.TempDir(), "slab")
	if err := os.WriteFile(p, bytes.Join(parts, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	uncache(t, p)
	var slots []*slot
	for i, b := range parts {
		if i == 19 {
			continue // a gap: 18 and 20 are two reads
		}
		a := record.Sum(b)
		slots = append(slots, &slot{e: &Extent{Vaddr: uint64(i) << 20, Size: uint64(len(b)), Path: p, Offset: uint64(i * len(b)), Verify: &a}, done: make(chan struct{})})
	}
	other := record.Sum(parts[9])
	slots[10].e.Verify = &other // chunk 10 listed as chunk 9's bytes
	last := slots[len(slots)-1].e
	last.Offset += last.Size // past the end
	d := &dirs{}
	defer d.close()
	for at := 0; at < len(slots); at += aioBatch {
		loadChunks(slots[at:min(at+aioBatch, len(slots))], d, r)
	}
	for k, sl := range slots {
		<-sl.done
		i := int(sl.e.Vaddr >> 20)
		switch {
		case k == 10 || k == len(slots)-1:
			if !errors.Is(sl.err, ErrRefused) {
				t.Errorf("chunk %d: %v, want ErrRefused", i, sl.err)
			}
		case sl.err != nil || !bytes.Equal(sl.b, parts[i]):
			t.Errorf("chunk %d: %d bytes, %v", i, len(sl.b), sl.err)
		}
	}
	if inCache(t, p) {
		t.Error("the slab was read through the page cache")
	}
}
