//go:build linux

package executor

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
)

// Output names the files a sandbox's stdout and stderr are appended to;
// an empty name discards that stream. The executor copies each stream from
// containerd's FIFO into its file, so a reader sees output as it is written.
type Output struct {
	Stdout string
	Stderr string
}

// openOutput opens the output files for appending, each capped at
// s.logBytes (see capped).
func (s *Sandbox) openOutput(out Output) (io.Writer, io.Writer, error) {
	open := func(i int, stream, name string) (io.Writer, error) {
		if name == "" {
			return io.Discard, nil
		}
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("output: %w", err)
		}
		s.files = append(s.files, f)
		w, err := newCapped(f, stream, int64(min(s.logBytes, 1<<62)), s.c.log.With("sandbox", s.id))
		if err != nil {
			return nil, fmt.Errorf("output: %w", err)
		}
		s.out[i] = w
		return w, nil
	}
	stdout, err := open(0, "stdout", out.Stdout)
	if err != nil {
		return nil, nil, err
	}
	stderr, err := open(1, "stderr", out.Stderr)
	if err != nil {
		return nil, nil, err
	}
	return stdout, stderr, nil
}

// Omitted is how many bytes of the unit's stdout and stderr this process
// has discarded since it attached, past the spec's LogBytes.
func (s *Sandbox) Omitted() (stdout, stderr uint64) {
	if w := s.out[0]; w != nil {
		stdout = w.omitted.Load()
	}
	if w := s.out[1]; w != nil {
		stderr = w.omitted.Load()
	}
	return stdout, stderr
}

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
