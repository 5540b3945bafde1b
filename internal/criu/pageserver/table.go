package pageserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// PageSize is the unit of every extent's address and size.
const PageSize = 4096

// Limits of a extent table, which bound what the server holds.
const (
	// MaxExtentSize is the largest extent a verified one is read whole
	// to hash: a stored chunk is at most 1 MiB.
	MaxExtentSize = 1 << 20
	// MaxExtents is the most extents of a extent table: 64 GiB of memory in
	// 16 KiB chunks, or that many runs of whole pages files.
	MaxExtents = 1 << 22
	// maxPath bounds one extent's file name.
	maxPath = 4096
	// maxTasks bounds the tasks (a unit's processes).
	maxTasks = 1 << 16
)

// ErrTable is a extent table that does not decode, or breaks its rules:
// extents out of address order or overlapping, not whole pages, or past a
// limit.
var ErrTable = errors.New("pageserver: extent table refused")

// Extent is a run of a task's pages at consecutive virtual addresses,
// stored at Offset of the file Path.
type Extent struct {
	Vaddr  uint64
	Size   uint64 // bytes: whole pages
	Path   string
	Offset uint64
	// Verify, when set, is the address the extent's Size bytes at
	// Offset of its file must hash to before the first of its pages is
	// served (a stored chunk: its own file, or its range of a slab);
	// Size is then at most MaxExtentSize. Unset for a file the caller
	// verified before the restore.
	Verify *record.Address
	// Owed, for a verified extent, is a chunk its file holds only once
	// the daemon fetched it (Table.Fetch): a post-copy migration's.
	Owed bool
}

// Task is one restored process's lazy memory: ID is the process id its
// images are named by (pagemap-ID.img), which lazy-pages asks pages by;
// its extents are in address order and do not overlap.
type Task struct {
	ID      uint64
	Extents []Extent
}

// Table is what a page server serves.
type Table struct {
	Tasks []Task
	// Uffds is how many userfaultfds lazy-pages holds during the restore
	// it serves: one per process with a pagemap, lazy pages or not (CRIU's
	// restore sends one for every process but a zombie, and lazy-pages,
	// patched, keeps them all until every page is in). Not encoded: it is
	// the daemon's, for pageserver.LazyPages.HoldUffds.
	Uffds int
	// Fetch brings an owed extent's chunk into its file, verified, and
	// returns nil once it is there: the page server asks for each before
	// it reads it (fetch.go). Not encoded: the daemon's, needed when an
	// extent is owed.
	Fetch func(ctx context.Context, e Extent) error
}

// tableMagic starts an encoded extent table.
const tableMagic = "rr-pageserver-1\n"

// Encode writes m, the table the daemon hands a page server on its stdin
// (never stored): the magic, then u32 tasks; per task u64 id, u32 extents; per extent u64 vaddr, u64
// size, u64 offset, u8 flags (0; 1 verified; 3 verified and owed) and then
// its 32-byte address when verified, u16 path length and the path.
// Integers are big-endian.
func (m *Table) Encode(w io.Writer) error {
	if err := m.Check(); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	b := append([]byte(tableMagic), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(b[len(tableMagic):], uint32(len(m.Tasks)))
	for _, t := range m.Tasks {
		b = binary.BigEndian.AppendUint64(b, t.ID)
		b = binary.BigEndian.AppendUint32(b, uint32(len(t.Extents)))
		for _, e := range t.Extents {
			b = binary.BigEndian.AppendUint64(b, e.Vaddr)
			b = binary.BigEndian.AppendUint64(b, e.Size)
			b = binary.BigEndian.AppendUint64(b, e.Offset)
			if e.Verify != nil {
				b = append(b, 1|owedFlag(e.Owed))
				b = append(b, e.Verify[:]...)
			} else {
				b = append(b, 0)
			}
			b = binary.BigEndian.AppendUint16(b, uint16(len(e.Path)))
			b = append(b, e.Path...)
			if len(b) > 1<<15 {
				if _, err := bw.Write(b); err != nil {
					return err
				}
				b = b[:0]
			}
		}
	}
	if _, err := bw.Write(b); err != nil {
		return err
	}
	return bw.Flush()
}

// Decode reads a extent table Encode wrote, checking its rules (a refusal
// wraps [ErrTable]).
func Decode(r io.Reader) (*Table, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	d := decoder{r: br}
	if string(d.bytes(len(tableMagic))) != tableMagic {
		return nil, d.fail("not a page server extent table")
	}
	nt := d.u32()
	if nt > maxTasks {
		return nil, d.fail(fmt.Sprintf("%d tasks", nt))
	}
	m := &Table{Tasks: make([]Task, 0, min(nt, 64))}
	total := 0
	for range nt {
		t := Task{ID: d.u64()}
		ne := int(d.u32())
		if total += ne; total > MaxExtents || d.err != nil {
			return nil, d.fail(fmt.Sprintf("more than %d extents", MaxExtents))
		}
		t.Extents = make([]Extent, 0, min(ne, 1<<12))
		for range ne {
			e := Extent{Vaddr: d.u64(), Size: d.u64(), Offset: d.u64()}
			switch fl := d.u8(); fl {
			case 0:
			case 1, 3:
				var a record.Address
				copy(a[:], d.bytes(len(a)))
				e.Verify, e.Owed = &a, fl == 3
			default:
				return nil, d.fail(fmt.Sprintf("an extent's flags are %d", fl))
			}
			n := int(d.u16())
			if n == 0 || n > maxPath {
				return nil, d.fail(fmt.Sprintf("a path of %d bytes", n))
			}
			e.Path = string(d.bytes(n))
			if d.err != nil {
				return nil, d.fail("truncated")
			}
			t.Extents = append(t.Extents, e)
		}
		m.Tasks = append(m.Tasks, t)
	}
	if d.err != nil {
		return nil, d.fail("truncated")
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return nil, d.fail("bytes past the last extent")
	}
	if err := m.Check(); err != nil {
		return nil, err
	}
	return m, nil
}

// Check checks the extent table's rules (a refusal wraps [ErrTable]).
func (m *Table) Check() error {
	if len(m.Tasks) > maxTasks {
		return fmt.Errorf("%w: %d tasks", ErrTable, len(m.Tasks))
	}
	ids := make(map[uint64]bool, len(m.Tasks))
	total := 0
	for _, t := range m.Tasks {
		if ids[t.ID] {
			return fmt.Errorf("%w: task %d listed twice", ErrTable, t.ID)
		}
		ids[t.ID] = true
		if total += len(t.Extents); total > MaxExtents {
			return fmt.Errorf("%w: more than %d extents", ErrTable, MaxExtents)
		}
		var end uint64
		for i, e := range t.Extents {
			switch {
			case e.Size == 0 || e.Size%PageSize != 0 || e.Vaddr%PageSize != 0:
				return fmt.Errorf("%w: task %d: extent %#x+%d is not whole pages", ErrTable, t.ID, e.Vaddr, e.Size)
			case e.Vaddr+e.Size < e.Vaddr || e.Offset+e.Size < e.Offset || e.Offset > 1<<62:
				return fmt.Errorf("%w: task %d: extent %#x+%d overflows", ErrTable, t.ID, e.Vaddr, e.Size)
			case i > 0 && e.Vaddr < end:
				return fmt.Errorf("%w: task %d: extent %#x is below the end of the one before it", ErrTable, t.ID, e.Vaddr)
			case e.Owed && e.Verify == nil:
				return fmt.Errorf("%w: task %d: an owed extent %#x is not verified", ErrTable, t.ID, e.Vaddr)
			case e.Verify != nil && e.Size > MaxExtentSize:
				return fmt.Errorf("%w: task %d: a verified extent %#x+%d is larger than a chunk", ErrTable, t.ID, e.Vaddr, e.Size)
			case e.Path == "" || len(e.Path) > maxPath:
				return fmt.Errorf("%w: task %d: extent %#x: a path of %d bytes", ErrTable, t.ID, e.Vaddr, len(e.Path))
			}
			end = e.Vaddr + e.Size
		}
	}
	return nil
}

// owedFlag is an extent's flag bit for Owed.
func owedFlag(owed bool) byte {
	if owed {
		return 2
	}
	return 0
}

// find returns the index of the extent holding vaddr, or -1.
func (t *Task) find(vaddr uint64) int {
	i := sort.Search(len(t.Extents), func(i int) bool { return t.Extents[i].Vaddr+t.Extents[i].Size > vaddr })
	if i == len(t.Extents) || t.Extents[i].Vaddr > vaddr {
		return -1
	}
	return i
}

// decoder reads big-endian integers, remembering the first error.
type decoder struct {
	r   *bufio.Reader
	err error
	buf [8]byte
}

func (d *decoder) bytes(n int) []byte {
	b := make([]byte, n)
	if d.err == nil {
		_, d.err = io.ReadFull(d.r, b)
	}
	return b
}

func (d *decoder) fixed(n int) []byte {
	if d.err == nil {
		_, d.err = io.ReadFull(d.r, d.buf[:n])
	}
	if d.err != nil {
		clear(d.buf[:n])
	}
	return d.buf[:n]
}

func (d *decoder) u8() uint8   { return d.fixed(1)[0] }
func (d *decoder) u16() uint16 { return binary.BigEndian.Uint16(d.fixed(2)) }
func (d *decoder) u32() uint32 { return binary.BigEndian.Uint32(d.fixed(4)) }
func (d *decoder) u64() uint64 { return binary.BigEndian.Uint64(d.fixed(8)) }

func (d *decoder) fail(why string) error {
	if d.err != nil && !errors.Is(d.err, io.EOF) && !errors.Is(d.err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %s: %w", ErrTable, why, d.err)
	}
	return fmt.Errorf("%w: %s", ErrTable, why)
}
