package pageserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
	"unsafe"

	"github.com/runrecordd/runrecordd/pkg/record"
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
	// ErrRequest is a request the manifest cannot answer: an unknown
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

// Server serves one manifest's pages.
type Server struct {
	m        *Manifest
	tasks    map[uint64]*Task
	verified map[*Extent]bool
	ahead    *ahead
	buf      []byte
	stats    Stats

	// held, when set, says (HeldByte, or its end) whether the unit's
	// userfaultfds are held elsewhere; hangUp is whether a failed
	// request may end the connection.
	held   io.Reader
	hangUp bool

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
// userfaultfds are held.
const HeldByte = 'h'

// keepBytes bounds the verified chunks kept for their pages not yet sent;
// past it, a chunk's later pages are read and verified again.
const keepBytes = 64 << 20

// Hold makes the server wait, before it answers the first request, for
// word from held that the unit's userfaultfds are held by another
// process (one HeldByte): then a fault on a page the server does not
// send waits, even once lazy-pages has ended. Until that word no page is
// sent, so no refusal can end lazy-pages first and leave the unit
// reading zeros where its pages were. Should held end without it (the
// daemon ended first), the server serves, but a request it cannot answer
// then ends nothing: it stops answering and keeps the connection until
// lazy-pages hangs up, the unit waiting on its fault until it is killed.
func (s *Server) Hold(held io.Reader) { s.held = held }

// New is a server of m, which must have passed its checks (Decode).
func New(m *Manifest) *Server {
	s := &Server{m: m, tasks: make(map[uint64]*Task, len(m.Tasks)), verified: map[*Extent]bool{}, ahead: newAhead(m),
		hangUp: true, kept: map[*Extent]*keptChunk{}, keepMax: keepBytes}
	for i := range m.Tasks {
		s.tasks[m.Tasks[i].ID] = &m.Tasks[i]
	}
	return s
}

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
	defer func() { s.ahead.stop(err != nil) }()
	for r := range reqs {
		if r.readErr {
			return fmt.Errorf("pageserver: lazy-pages hung up: %w", io.ErrUnexpectedEOF)
		}
		if s.held != nil {
			s.hangUp = isHeld(s.held)
			s.held = nil
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
			if !s.hangUp {
				drain(reqs)
			}
			return err
		}
	}
	return nil
}

// isHeld waits for word from held: true on HeldByte, false on its end.
func isHeld(held io.Reader) bool {
	var b [1]byte
	n, _ := io.ReadFull(held, b[:])
	return n == 1 && b[0] == HeldByte
}

// drain reads requests, answering none, until lazy-pages hangs up.
func drain(reqs <-chan request) {
	for range reqs {
	}
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
		return fmt.Errorf("%w: pages of task %d, which the manifest does not hold", ErrRequest, r.dst)
	}
	if r.pages == 0 || r.vaddr%PageSize != 0 {
		return fmt.Errorf("%w: task %d: %d pages at %#x", ErrRequest, r.dst, r.pages, r.vaddr)
	}
	i := t.find(r.vaddr)
	if i < 0 {
		return fmt.Errorf("%w: task %d: no extent holds %#x", ErrRequest, r.dst, r.vaddr)
	}
	want := min(r.pages, maxReply/PageSize) * PageSize
	if cap(s.buf) < headerSize+int(want) {
		s.buf = make([]byte, headerSize, headerSize+maxReply)
	}
	b := s.buf[:headerSize]
	v, off := r.vaddr, r.vaddr-t.Extents[i].Vaddr
	for ; i < len(t.Extents) && uint64(len(b)-headerSize) < want; i++ {
		e := &t.Extents[i]
		if e.Vaddr+off != v {
			break // a gap: lazy-pages asks again for the rest
		}
		n := min(e.Size-off, want-uint64(len(b)-headerSize))
		var err error
		if b, err = s.read(b, e, off, n); err != nil {
			return err
		}
		v, off = v+n, 0
	}
	if r.pages > 1 {
		// The background transfer's requests, not a fault's single
		// page: what follows is asked next.
		s.ahead.after(t, i, s.verified)
	}
	sent := uint64(len(b)-headerSize) / PageSize
	binary.NativeEndian.PutUint32(b[0:], cmdAdd)
	binary.NativeEndian.PutUint32(b[4:], 0)
	binary.NativeEndian.PutUint64(b[8:], sent)
	binary.NativeEndian.PutUint64(b[16:], r.vaddr)
	binary.NativeEndian.PutUint64(b[24:], r.dst)
	t0 := time.Now()
	_, err := conn.Write(b)
	s.stats.Written += time.Since(t0)
	if err != nil {
		return fmt.Errorf("pageserver: replying: %w", err)
	}
	s.stats.Requests++
	s.stats.Pages += sent
	return nil
}

// read appends n bytes of e from off within it (off is the request's
// distance past e's start when the request starts inside e): a verified
// extent's from the bytes that hashed to its address (kept, or read and
// hashed now), any other's from its file.
func (s *Server) read(b []byte, e *Extent, off, n uint64) ([]byte, error) {
	if e.Verify != nil {
		k, err := s.verifiedChunk(e)
		if err != nil {
			return b, err
		}
		b = append(b, k.b[off:off+n]...)
		if k.sent += n; k.sent >= e.Size && s.kept[e] == k {
			delete(s.kept, e)
			s.keptBytes -= e.Size
		}
		return b, nil
	}
	f, err := os.Open(e.Path)
	if err != nil {
		return b, fmt.Errorf("pageserver: extent %#x: %w", e.Vaddr, err)
	}
	defer f.Close()
	start := len(b)
	b = b[:start+int(n)]
	if _, err := f.ReadAt(b[start:], int64(e.Offset+off)); err != nil {
		return b[:start], fmt.Errorf("pageserver: extent %#x of %s at %d: %w", e.Vaddr, e.Path, e.Offset+off, err)
	}
	return b, nil
}

// verifiedChunk is verified extent e's bytes: kept from an earlier
// request, or read (ahead, or now) and hashed, then kept while there is
// room (others let go to make it).
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
	k := &keptChunk{b: whole}
	for old := range s.kept {
		if s.keptBytes+e.Size <= s.keepMax {
			break
		}
		s.keptBytes -= old.Size
		delete(s.kept, old)
	}
	if s.keptBytes+e.Size <= s.keepMax {
		s.kept[e] = k
		s.keptBytes += e.Size
	}
	return k, nil
}

// loadChunk reads verified extent e's file whole and checks it hashes to
// its listed address. A chunk the page cache holds whole (a resume soon
// after its park) is copied from it; any other is read with O_DIRECT
// where the filesystem allows: a chunk is read once, and its pages go to
// the unit, not to the page cache (cold, 512 MiB of chunk files cost
// about a second of processor time through the page cache, on a machine
// where lazy-pages needs the other processor; and O_DIRECT for every
// chunk read a just-parked unit's cached chunks from the disk one by
// one). Raw system calls: an os.File costs a netpoller registration and a
// finalizer per chunk, 32,768 of them for a 512 MiB unit.
func loadChunk(e *Extent) ([]byte, error) {
	fd, err := unix.Open(e.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pageserver: extent %#x: %s: %w", e.Vaddr, e.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("pageserver: extent %#x: %w", e.Vaddr, err)
	}
	if st.Size != int64(e.Size) || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: %s holds %d bytes, the chunk at %#x is %d", ErrRefused, e.Path, st.Size, e.Vaddr, e.Size)
	}
	whole := aligned(int(e.Size))
	if !cached(fd, e.Size) {
		// Where O_DIRECT cannot be set, the read goes through the cache.
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_RDONLY|unix.O_DIRECT)
	}
	for off := 0; off < len(whole); {
		n, err := unix.Pread(fd, whole[off:], int64(off))
		if err == unix.EINTR {
			continue
		}
		if err == nil && n == 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, fmt.Errorf("pageserver: extent %#x: %s: %w", e.Vaddr, e.Path, err)
		}
		off += n
	}
	if got := record.Sum(whole); got != *e.Verify {
		return nil, fmt.Errorf("%w: the chunk at %#x hashes to %s, listed as %s", ErrRefused, e.Vaddr, got, *e.Verify)
	}
	return whole, nil
}

// cached reports whether the page cache holds all size bytes of file fd
// (cachestat, Linux 6.5; false where it fails).
func cached(fd int, size uint64) bool {
	var cs unix.Cachestat_t
	r := unix.CachestatRange{Off: 0, Len: size}
	return unix.Cachestat(uint(fd), &r, &cs, 0) == nil && cs.Cache*PageSize >= size
}

// aligned is n bytes starting at a page boundary, as O_DIRECT reads need.
func aligned(n int) []byte {
	b := make([]byte, n+PageSize)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (PageSize - 1))
	if off != 0 {
		off = PageSize - off
	}
	return b[off : off+n : off+n]
}
