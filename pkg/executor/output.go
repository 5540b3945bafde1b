//go:build linux

package executor

import (
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
)

// capped is one output stream's file, capped at max bytes: what the unit
// writes past the cap is discarded and counted, after one line that says
// so is appended. A write never fails towards the copier (containerd's
// FIFO copy), which would stop copying and leave the unit blocked on a
// full pipe: a failed write to the file counts as omitted too.
//
// The cap is on the file, across the sandbox's lives: a file already at
// its cap when opened (a reattach, a restored sandbox appending to its
// run's files) is taken to carry its note already.
type capped struct {
	f      *os.File
	stream string // "stdout" or "stderr", for the note
	max    int64
	log    *slog.Logger

	n       int64 // bytes in the file; only the copier's goroutine writes
	noted   bool
	failed  bool // a write to the file failed (logged once)
	omitted atomic.Uint64
}

func newCapped(f *os.File, stream string, max int64, log *slog.Logger) (*capped, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return &capped{f: f, stream: stream, max: max, log: log, n: fi.Size(), noted: fi.Size() >= max}, nil
}

// capNote is the line a capped stream's file ends with.
func capNote(stream string, max int64) string {
	return fmt.Sprintf("\n[runrecordd: %s reached its limit of %d bytes; what the unit wrote after it is discarded]\n", stream, max)
}

func (w *capped) Write(p []byte) (int, error) {
	total := len(p)
	if room := w.max - w.n; room > 0 {
		k := min(int64(len(p)), room)
		n, err := w.f.Write(p[:k])
		w.n += int64(n)
		if err != nil {
			w.fail(err)
			w.omitted.Add(uint64(total - n))
			return total, nil
		}
		p = p[k:]
	}
	if len(p) == 0 {
		return total, nil
	}
	if !w.noted {
		w.noted = true
		if _, err := w.f.WriteString(capNote(w.stream, w.max)); err != nil {
			w.fail(err)
		}
		w.log.Warn("unit output capped", "stream", w.stream, "limit", w.max)
	}
	w.omitted.Add(uint64(len(p)))
	return total, nil
}

func (w *capped) fail(err error) {
	if !w.failed {
		w.failed = true
		w.log.Error("unit output: writing the file failed; what the unit writes is discarded", "stream", w.stream, "err", err)
	}
}
