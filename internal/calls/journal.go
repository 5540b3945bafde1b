package calls

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// maxScannedEntry bounds an entry scanJournal hands over: larger than any
// entry the channel writes (a request line is at most 1 MiB).
const maxScannedEntry = 4 << 20

// scanJournal reads the journal of the interval attested at att as a
// stream, verified against its address as it is read, and calls fn with
// each entry of a kind in kinds (others are skipped unread), so that a
// journal is never held whole in memory. fn's entries are only to be
// trusted when scanJournal returns nil: the object is verified at its end.
func scanJournal(st Objects, att record.Address, kinds []attest.EntryKind, fn func(attest.Entry)) error {
	b, err := st.ReadAll(att)
	if err != nil {
		return err
	}
	body, err := attest.Open(b, nil)
	if err != nil {
		return err
	}
	r, err := st.Open(body.Journal)
	if err != nil {
		return err
	}
	defer r.Close()
	br := bufio.NewReader(r)
	head := make([]byte, len(attest.JournalDomain)+4)
	if _, err := io.ReadFull(br, head); err != nil || string(head[:len(attest.JournalDomain)]) != attest.JournalDomain {
		return fmt.Errorf("%w: journal %s: no journal header", attest.ErrMalformed, body.Journal)
	}
	n := binary.BigEndian.Uint32(head[len(attest.JournalDomain):])
	var eh [13]byte
	for range n {
		if _, err := io.ReadFull(br, eh[:]); err != nil {
			return fmt.Errorf("%w: journal %s: %v", attest.ErrMalformed, body.Journal, err)
		}
		e := attest.Entry{Kind: attest.EntryKind(eh[0]), AtNS: int64(binary.BigEndian.Uint64(eh[1:9]))}
		size := int64(binary.BigEndian.Uint32(eh[9:13]))
		want := false
		for _, k := range kinds {
			want = want || k == e.Kind
		}
		if !want || size > maxScannedEntry {
			if _, err := io.CopyN(io.Discard, br, size); err != nil {
				return fmt.Errorf("%w: journal %s: %v", attest.ErrMalformed, body.Journal, err)
			}
			continue
		}
		e.Data = make([]byte, size)
		if _, err := io.ReadFull(br, e.Data); err != nil {
			return fmt.Errorf("%w: journal %s: %v", attest.ErrMalformed, body.Journal, err)
		}
		fn(e)
	}
	// The end: trailing bytes are malformed, and reading to EOF verifies
	// the object against its address.
	if extra, err := io.Copy(io.Discard, br); err != nil {
		return err
	} else if extra != 0 {
		return fmt.Errorf("%w: journal %s: trailing bytes", attest.ErrMalformed, body.Journal)
	}
	return nil
}
