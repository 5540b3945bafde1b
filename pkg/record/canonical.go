package record

import (
	"encoding/binary"
	"fmt"
)

// Canonical byte tags. docs/record-format.md is the reference; the tests
// pin every layout against bytes written out by hand.
const (
	snapImage      = 0x01
	snapTranscript = 0x02
	absent         = 0x00
	present        = 0x01
)

// AppendCanonical validates s and appends its canonical bytes to b. A
// segment that fails [Segment.Validate] is refused before any byte is
// written, so a malformed snapshot is never hashed.
func (s Segment) AppendCanonical(b []byte) ([]byte, error) {
	if err := s.validate(); err != nil {
		return b, err
	}
	return s.appendCanonical(b), nil
}

// Canonical returns s's canonical bytes.
func (s Segment) Canonical() ([]byte, error) { return s.AppendCanonical(nil) }

// appendCanonical encodes a segment already validated.
func (s *Segment) appendCanonical(b []byte) []byte {
	b = append(b, byte(s.Kind))
	switch s.Kind {
	case Executed:
		b = append(b, s.Attestation[:]...)
		if s.Calls == nil {
			return append(b, absent)
		}
		b = append(b, present)
		b = appendIDs(b, s.Calls.Dispatched)
		return appendIDs(b, s.Calls.Resolved)
	case Suspended:
		b = s.Snapshot.appendCanonical(b)
		return append(b, s.Manifest[:]...)
	case Resumed:
		b = s.Snapshot.appendCanonical(b)
		b = binary.BigEndian.AppendUint64(b, s.IdleUJ)
		return append(b, byte(s.Provenance))
	case Closed:
		b = binary.BigEndian.AppendUint32(b, uint32(len(s.Reason)))
		return append(b, s.Reason...)
	}
	panic("record: appendCanonical on an unvalidated segment")
}

func appendIDs(b []byte, ids []string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		b = binary.BigEndian.AppendUint32(b, uint32(len(id)))
		b = append(b, id...)
	}
	return b
}

// AppendCanonical validates s and appends its canonical bytes to b.
func (s Snapshot) AppendCanonical(b []byte) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return b, err
	}
	return s.appendCanonical(b), nil
}

func (s Snapshot) appendCanonical(b []byte) []byte {
	if s.Transcript != nil {
		b = append(b, snapTranscript)
		return append(b, s.Transcript[:]...)
	}
	b = append(b, snapImage)
	b = append(b, s.Root[:]...)
	if s.Memory == nil {
		return append(b, absent)
	}
	b = append(b, present)
	return append(b, s.Memory[:]...)
}

// DecodeSegment parses canonical segment bytes. It accepts only bytes that
// [Segment.AppendCanonical] writes: no trailing bytes, markers 0 or 1, and
// a segment that validates. Errors wrap [ErrCanonical] or the validation
// error.
func DecodeSegment(b []byte) (Segment, error) {
	d := decoder{b: b}
	s := d.segment()
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return Segment{}, d.err
	}
	if err := s.Validate(); err != nil {
		return Segment{}, err
	}
	return s, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCanonical, fmt.Sprintf(format, args...))
	}
	d.b = nil
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail("truncated: need %d bytes, have %d", n, len(d.b))
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) byte1() byte {
	p := d.take(1)
	if p == nil {
		return 0
	}
	return p[0]
}

func (d *decoder) u32() uint32 {
	p := d.take(4)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint32(p)
}

func (d *decoder) u64() uint64 {
	p := d.take(8)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint64(p)
}

func (d *decoder) addr() Address {
	var a Address
	copy(a[:], d.take(32))
	return a
}

func (d *decoder) marker() bool {
	switch m := d.byte1(); m {
	case absent:
		return false
	case present:
		return true
	default:
		d.fail("optional-field marker 0x%02x", m)
		return false
	}
}

func (d *decoder) str(limit int) string {
	n := d.u32()
	if int64(n) > int64(limit) {
		d.fail("length %d over limit %d", n, limit)
		return ""
	}
	return string(d.take(int(n)))
}

func (d *decoder) ids() []string {
	n := d.u32()
	if n > MaxCalls {
		d.fail("%d call ids over limit %d", n, MaxCalls)
		return nil
	}
	ids := make([]string, 0, min(int(n), len(d.b)/4))
	for range n {
		ids = append(ids, d.str(MaxCallIDLen))
		if d.err != nil {
			return nil
		}
	}
	return ids
}

func (d *decoder) snapshot() Snapshot {
	switch form := d.byte1(); form {
	case snapImage:
		root := d.addr()
		s := Snapshot{Root: &root}
		if d.marker() {
			mem := d.addr()
			s.Memory = &mem
		}
		return s
	case snapTranscript:
		t := d.addr()
		return Snapshot{Transcript: &t}
	default:
		d.fail("snapshot form 0x%02x", form)
		return Snapshot{}
	}
}

func (d *decoder) segment() Segment {
	s := Segment{Kind: Kind(d.byte1())}
	switch s.Kind {
	case Executed:
		s.Attestation = d.addr()
		if d.marker() {
			s.Calls = &CallAccount{Dispatched: d.ids()}
			s.Calls.Resolved = d.ids()
		}
	case Suspended:
		s.Snapshot = d.snapshot()
		s.Manifest = d.addr()
	case Resumed:
		s.Snapshot = d.snapshot()
		s.IdleUJ = d.u64()
		s.Provenance = Provenance(d.byte1())
	case Closed:
		s.Reason = d.str(MaxReasonLen)
	default:
		d.fail("segment kind 0x%02x", byte(s.Kind))
	}
	return s
}
