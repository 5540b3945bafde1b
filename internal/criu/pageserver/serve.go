package pageserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The page server's side of CRIU's page transfer protocol (criu 4.2,
// criu/page-xfer.c), as `criu lazy-pages --page-server` speaks it over an
// inherited socket (--ps-socket). Every message starts with a 32-byte
// header in the host's byte order: u32 command, 4 bytes of padding, u64
// number of pages, u64 virtual address, u64 destination id (the task's
// pid).
const (
	headerSize = 32
	cmdAdd     = 1      // PS_IOV_ADD: the reply to a GET, its pages follow
	cmdGet     = 7      // PS_IOV_GET: send nr_pages pages at vaddr of task dst_id
	cmdClose   = 0x1023 // PS_IOV_CLOSE: answered by an int32 0, then the end
	cmdForce   = 0x1024 // PS_IOV_FORCE_CLOSE: the same, over an inherited socket
	cmdMask    = 0xffff // the low 16 bits are the command, the rest flags
	// maxReply bounds the pages of one reply: lazy-pages takes fewer
	// pages than it asked for, and asks again for the rest.
	maxReply = 4 << 20
	// queued bounds the requests read ahead of the replies: lazy-pages
	// sends its requests without waiting (MSG_DONTWAIT), so the server
	// keeps reading them while it writes replies.
	queued = 4096
)

// Errors of a serve: a page server that returns one of them hangs up, and
// lazy-pages, the restore's pages then lost, exits with an error.
var (
	// ErrRefused is a verified extent whose file does not hash to its
	// listed address: none of its pages is served.
	ErrRefused = errors.New("pageserver: a chunk's bytes are not the ones listed")
	// ErrRequest is a request the extent table cannot answer: an unknown
	// command or task, or pages it does not hold.
	ErrRequest = errors.New("pageserver: request refused")
)

// request is one decoded header.
type request struct {
	cmd          uint32
	pages, vaddr uint64
	dst          uint64
	readErr      bool
}

// Stats is what a serve did.
type Stats struct {
	Requests int    // GET requests answered
	Pages    uint64 // pages sent
	Verified int    // extents hashed before their first page was sent
	// Waited is the time spent waiting for chunks read and hashed (ahead
	// or not), Written the time writing replies.
	Waited, Written time.Duration
}

// Server serves one extent table's pages.
type Server struct {
	m        *Table
	tasks    map[uint64]*Task
	verified map[*Extent]bool
	ahead    *ahead
	stats    Stats

	// A reply is written from its pieces, not copied into one buffer:
	// hdr, then slices of verified chunks' buffers and of own (the pages
	// of other extents, read for this reply). A chunk buffer let go while
	// the reply is built waits in later until the reply is written.
	hdr   [headerSize]byte
	iov   [][]byte
	own   []byte
	later [][]byte

	// holds, when Hold was called, is the daemon's word on the unit's
	// userfaultfds (holds.watch): whether a failed request may end the
	// connection.
	holds *holds

	// kept is the verified chunks some of whose pages are not sent yet,
	// up to keepMax bytes: their other pages are sent from the bytes
	// that were hashed, never read again unhashed.
	kept      map[*Extent]*keptChunk
	keptBytes uint64
	keepMax   uint64
}

// keptChunk is a verified chunk's bytes and how many of them were sent.
type keptChunk struct {
	b    []byte
	sent uint64
}

// HeldByte, read from [Server.Hold]'s reader, says the unit's
// userfaultfds are held; the reader's end after it, that they are not
// any more.
const HeldByte = 'h'

// keepBytes bounds the verified chunks kept for their pages not yet sent;
// past it, a chunk's later pages are read and verified again.
const keepBytes = 64 << 20

// Hold gives the server the daemon's word on the unit's userfaultfds:
// one HeldByte once it holds copies of them, then the reader's end when
// it lets them go (or ends itself). Pages are served at once; only a
// request that fails waits for the word: while the copies are held, a
// fault on a page the server does not send waits even once lazy-pages
// has ended, so the server hangs up. Otherwise — the word not given, or
// taken back — hanging up would end lazy-pages, close the last
// userfaultfds, and let the kernel fill the unit's missing pages with
// zeros: the server answers nothing more and keeps the connection until
// lazy-pages hangs up (the unit killed). The word is waited for, not
// required before the first page: CRIU's restore can fault on lazy pages
// before it returns (the kernel writing a restored thread's rseq area),
// and the daemon takes the copies only once it has returned.
func (s *Server) Hold(held io.Reader) {
	h := &holds{said: make(chan struct{})}
	s.holds = h
	go h.watch(held)
}

// holds is the daemon's word on the userfaultfds, as watch reads it.
type holds struct {
	said chan struct{} // closed once the first word (byte or end) came
	held atomic.Bool   // the copies are held now
}

// watch reads held: HeldByte, then its end; or its end alone.
func (h *holds) watch(held io.Reader) {
	var b [1]byte
	n, _ := io.ReadFull(held, b[:])
	h.held.Store(n == 1 && b[0] == HeldByte)
	close(h.said)
	if h.held.Load() {
		_, _ = io.Copy(io.Discard, held)
		h.held.Store(false)
	}
}

// mayHangUp is whether a failed serve may end the connection: without
// Hold, yes; with it, once the word came, whether the copies are held.
func (s *Server) mayHangUp() bool {
	if s.holds == nil {
		return true
	}
	<-s.holds.said
	return s.holds.held.Load()
}

// New is a server of m, which must have passed its checks (Decode).
func New(m *Table) *Server {
	s := &Server{m: m, tasks: make(map[uint64]*Task, len(m.Tasks)), verified: map[*Extent]bool{}, ahead: newAhead(m),
		kept: map[*Extent]*keptChunk{}, keepMax: keepBytes}
	for i := range m.Tasks {
		s.tasks[m.Tasks[i].ID] = &m.Tasks[i]
	}
	return s
}

// FetchFrom has the server ask the daemon on rw for each owed extent of
// its table before it reads it (fetch.go). Call it before Serve.
func (s *Server) FetchFrom(rw io.ReadWriter) { s.ahead.fetch = newFetcher(s.m, rw) }

// Stats is what the serve has done so far.
func (s *Server) Stats() Stats { return s.stats }

// Serve answers lazy-pages on conn until it says it is done (nil) or
// hangs up (io.ErrUnexpectedEOF), or a request cannot be answered (an
// error wrapping ErrRefused or ErrRequest; then nothing more is sent, and
// the caller closes conn — at once, unless [Server.Hold] heard that
// nobody holds the unit's userfaultfds: then Serve returns only once
// lazy-pages has hung up).
func (s *Server) Serve(conn io.ReadWriter) (err error) {
	reqs := make(chan request, queued)
	go readRequests(conn, reqs)
	defer func() {
		if s.ahead.fetch != nil {
			// Done or failed: no read ahead waits for a fetch (lazy-pages
			// may never ask for the chunks it was reading).
			s.ahead.fetch.end(errCanceled)
		}
		s.ahead.stop(err != nil)
	}()
	for r := range reqs {
		if r.readErr {
			return fmt.Errorf("pageserver: lazy-pages hung up: %w", io.ErrUnexpectedEOF)
		}
		switch c := r.cmd & cmdMask; {
		case c == cmdClose || c == cmdForce:
			var ok [4]byte // int32 0
			_, err := conn.Write(ok[:])
			return err
		case c != cmdGet:
			err = fmt.Errorf("%w: command %#x", ErrRequest, r.cmd)
		default:
			err = s.get(conn, r)
		}
		if err != nil {
			if !s.mayHangUp() {
				drain(reqs, conn)
			}
			return err
		}
	}
	return nil
}

// drain reads requests, answering none, until lazy-pages hangs up: what
// the request reader left unread after a command that ended it, too.
func drain(reqs <-chan request, conn io.Reader) {
	for range reqs {
	}
	_, _ = io.Copy(io.Discard, conn)
}

// readRequests reads headers into reqs until the connection ends or a
// close arrives.
func readRequests(conn io.Reader, reqs chan<- request) {
	defer close(reqs)
	var h [headerSize]byte
	for {
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			reqs <- request{readErr: true}
			return
		}
		r := request{
			cmd:   binary.NativeEndian.Uint32(h[0:]),
			pages: binary.NativeEndian.Uint64(h[8:]),
			vaddr: binary.NativeEndian.Uint64(h[16:]),
			dst:   binary.NativeEndian.Uint64(h[24:]),
		}
		reqs <- r
		if c := r.cmd & cmdMask; c != cmdGet {
			return
		}
	}
}

// get answers one GET: as many of the asked pages as the extents at
// vaddr hold without a gap (at least one), each verified extent hashed
// before its first page goes.
func (s *Server) get(conn io.Writer, r request) error {
	t := s.tasks[r.dst]
	if t == nil {
		return fmt.Errorf("%w: pages of task %d, which the extent table does not hold", ErrRequest, r.dst)
	}
	if r.pages == 0 || r.vaddr%PageSize != 0 {
		return fmt.Errorf("%w: task %d: %d pages at %#x", ErrRequest, r.dst, r.pages, r.vaddr)
	}
	i := t.find(r.vaddr)
	if i < 0 {
		return fmt.Errorf("%w: task %d: no extent holds %#x", ErrRequest, r.dst, r.vaddr)
	}
	want := min(r.pages, maxReply/PageSize) * PageSize
	s.iov, s.own = append(s.iov[:0], s.hdr[:]), s.own[:0]
	defer s.written()
	got := uint64(0)
	v, off := r.vaddr, r.vaddr-t.Extents[i].Vaddr
	for ; i < len(t.Extents) && got < want; i++ {
		e := &t.Extents[i]
		if e.Vaddr+off != v {
			break // a gap: lazy-pages asks again for the rest
		}
		n := min(e.Size-off, want-got)
		if err := s.read(e, off, n); err != nil {
			return err
		}
		v, off, got = v+n, 0, got+n
	}
	if r.pages > 1 {
		// The background transfer's requests, not a fault's single
		// page: what follows is asked next.
		s.ahead.after(t, i, s.verified)
	}
	sent := got / PageSize
	binary.NativeEndian.PutUint32(s.hdr[0:], cmdAdd)
	binary.NativeEndian.PutUint32(s.hdr[4:], 0)
	binary.NativeEndian.PutUint64(s.hdr[8:], sent)
	binary.NativeEndian.PutUint64(s.hdr[16:], r.vaddr)
	binary.NativeEndian.PutUint64(s.hdr[24:], r.dst)
	t0 := time.Now()
	err := writeAll(conn, s.iov)
	s.stats.Written += time.Since(t0)
	if err != nil {
		return fmt.Errorf("pageserver: replying: %w", err)
	}
	s.stats.Requests++
	s.stats.Pages += sent
	return nil
}

// written gives back the chunk buffers let go while the reply was built,
// once nothing of it is to be written.
func (s *Server) written() {
	for _, b := range s.later {
		putBuf(b)
	}
	clear(s.iov)
	s.later = s.later[:0]
}

// letGo gives verified chunk buffer b back once the reply being built is
// written: a slice of it may be in the reply.
func (s *Server) letGo(b []byte) { s.later = append(s.later, b) }

// writeAll writes bufs to conn in order: with writev where conn is a
// file or socket, else one write at a time.
func writeAll(conn io.Writer, bufs [][]byte) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		nb := net.Buffers(bufs)
		_, err := nb.WriteTo(conn)
		return err
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	left := bufs
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for len(left) > 0 {
			n, err := unix.Writev(int(fd), left[:min(len(left), 1024)])
			if err == unix.EAGAIN {
				return false // wait until it can be written
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				werr = err
				return true
			}
			for n > 0 && len(left) > 0 {
				if n < len(left[0]) {
					left[0] = left[0][n:]
					n = 0
					break
				}
				n -= len(left[0])
				left = left[1:]
			}
			for len(left) > 0 && len(left[0]) == 0 {
				left = left[1:]
			}
		}
		return true
	})
	if err == nil {
		err = werr
	}
	return err
}

// read adds n bytes of e from off within it to the reply (off is the
// request's distance past e's start when the request starts inside e): a
// verified extent's from the bytes that hashed to its address (kept, or
// read and hashed now), any other's read from its file into own.
func (s *Server) read(e *Extent, off, n uint64) error {
	if e.Verify != nil {
		k, err := s.verifiedChunk(e)
		if err != nil {
			return err
		}
		s.iov = append(s.iov, k.b[off:off+n])
		k.sent += n
		switch {
		case k.sent >= e.Size:
			if s.kept[e] == k {
				delete(s.kept, e)
				s.keptBytes -= e.Size
			}
			s.letGo(k.b)
		case s.kept[e] == nil && !s.keep(e, k):
			s.letGo(k.b)
		}
		return nil
	}
	if s.own == nil {
		s.own = make([]byte, 0, maxReply) // a reply's pages fit: own never moves
	}
	f, err := os.Open(e.Path)
	if err != nil {
		return fmt.Errorf("pageserver: extent %#x: %w", e.Vaddr, err)
	}
	defer f.Close()
	start := len(s.own)
	b := s.own[start : start+int(n)]
	if _, err := f.ReadAt(b, int64(e.Offset+off)); err != nil {
		return fmt.Errorf("pageserver: extent %#x of %s at %d: %w", e.Vaddr, e.Path, e.Offset+off, err)
	}
	s.own = s.own[:start+int(n)]
	s.iov = append(s.iov, b)
	return nil
}

// verifiedChunk is verified extent e's bytes: kept from an earlier
// request, or read (ahead, or now) and hashed.
func (s *Server) verifiedChunk(e *Extent) (*keptChunk, error) {
	if k := s.kept[e]; k != nil {
		return k, nil
	}
	t0 := time.Now()
	whole, err := s.ahead.take(e)
	s.stats.Waited += time.Since(t0)
	if err != nil {
		return nil, err
	}
	if !s.verified[e] {
		s.verified[e] = true
		s.stats.Verified++
	}
	return &keptChunk{b: whole}, nil
}

// keep keeps verified chunk e, some of whose pages are not sent yet,
// while there is room (others let go to make it), and reports whether it
// did.
func (s *Server) keep(e *Extent, k *keptChunk) bool {
	for old, ok := range s.kept {
		if s.keptBytes+e.Size <= s.keepMax {
			break
		}
		s.keptBytes -= old.Size
		delete(s.kept, old)
		s.letGo(ok.b)
	}
	if s.keptBytes+e.Size > s.keepMax {
		return false
	}
	s.kept[e] = k
	s.keptBytes += e.Size
	return true
}
