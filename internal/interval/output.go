package interval

import (
	"errors"
	"io"
	"os"
	"time"

	"github.com/runrecordd/runrecordd/pkg/attest"
)

// journalChunk bounds one output entry of a replay journal.
const journalChunk = 64 << 10

// JournalOutputMax bounds the output of one stream a replay journal holds
// for one interval. A journal is held in memory while it is sealed; a unit
// that writes more in one interval has its output's first part recorded
// as omitted (how many bytes, from which offset of its output file) and
// its last JournalOutputMax bytes kept.
const JournalOutputMax = 16 << 20

// appendOutput adds the bytes of file p from off on as entries of kind.
func appendOutput(j *attest.Journal, kind attest.EntryKind, p string, off int64) error {
	if p == "" {
		return nil
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	at := time.Now().UnixNano()
	if omitted := st.Size() - off - JournalOutputMax; omitted > 0 {
		j.Entries = append(j.Entries, attest.LifecycleOf(at, attest.OutputOmitted{Stream: kind, FromOffset: off, Bytes: omitted}))
		off += omitted
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err
	}
	buf := make([]byte, journalChunk)
	r := io.LimitReader(f, JournalOutputMax)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			j.Add(kind, at, append([]byte(nil), buf[:n]...))
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
