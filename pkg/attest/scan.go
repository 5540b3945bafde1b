package attest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ScanJournal reads a journal object from r entry by entry, never all in
// memory: fn gets each entry's kind, time and a reader of its data, which
// it may leave unread (the rest is skipped). It stops at fn's first error
// and returns it, and returns an error wrapping ErrMalformed when r is not
// a whole journal (DecodeJournal's rules).
func ScanJournal(r io.Reader, fn func(kind EntryKind, atNS int64, data io.Reader) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	head := make([]byte, len(JournalDomain)+4)
	if _, err := io.ReadFull(br, head); err != nil {
		return fmt.Errorf("%w: not a journal: %w", ErrMalformed, err)
	}
	if string(head[:len(JournalDomain)]) != JournalDomain {
		return fmt.Errorf("%w: not a journal", ErrMalformed)
	}
	n := binary.BigEndian.Uint32(head[len(JournalDomain):])
	var eh [13]byte
	for range n {
		if _, err := io.ReadFull(br, eh[:]); err != nil {
			return fmt.Errorf("%w: journal truncated: %w", ErrMalformed, err)
		}
		k := EntryKind(eh[0])
		if k < Stdout || k > ClosedKind {
			return fmt.Errorf("%w: journal entry kind %d", ErrMalformed, k)
		}
		size := binary.BigEndian.Uint32(eh[9:])
		data := &io.LimitedReader{R: br, N: int64(size)}
		if k == TrafficKind || k == ResolutionKind || k == ClosedKind {
			// Small: checked whole, as DecodeJournal does.
			if size > max(maxResolutionSize, maxClosedSize) {
				return fmt.Errorf("%w: a kind %d entry of %d bytes", ErrMalformed, k, size)
			}
			b, err := io.ReadAll(data)
			if err != nil {
				return err
			}
			if err := checkEntry(k, b); err != nil {
				return err
			}
			data = &io.LimitedReader{R: bytes.NewReader(b), N: int64(len(b))}
		}
		if err := fn(k, int64(binary.BigEndian.Uint64(eh[1:9])), data); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, data); err != nil {
			return err
		}
		if data.N != 0 {
			return fmt.Errorf("%w: journal truncated", ErrMalformed)
		}
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		if err == nil {
			return fmt.Errorf("%w: journal with trailing bytes", ErrMalformed)
		}
		return err
	}
	return nil
}
