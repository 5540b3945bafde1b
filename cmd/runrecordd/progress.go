package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// progressFlag is --progress: on, off, or (not given) on when standard
// error is a terminal. Progress never goes to standard output, so -o json
// prints one object there whatever it is.
type progressFlag struct {
	set, on bool
}

func (p *progressFlag) String() string {
	if !p.set {
		return "auto"
	}
	return strconv.FormatBool(p.on)
}

func (p *progressFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	p.set, p.on = true, v
	return nil
}

func (p *progressFlag) IsBoolFlag() bool { return true }

func (p *progressFlag) register(fs *flag.FlagSet) {
	fs.Var(p, "progress", "print progress (bytes, rate, time left, or time so far) on standard error; default: when it is a terminal (--progress=false: never)")
}

// progressDelay is how long an operation goes before progress is shown on
// a terminal by default: a quick one prints nothing more.
const progressDelay = time.Second

// progressEvery is how often progress is rewritten on a terminal, and
// progressLogEvery how often a line of it is printed elsewhere (a log).
const (
	progressEvery    = 500 * time.Millisecond
	progressLogEvery = 5 * time.Second
)

// progress reports an operation's progress on w: bytes so far (Add, or a
// reader or writer wrapped by it), of total when known, with the rate and
// the time left; for an operation whose bytes this process does not see
// (a park, a migration), the time so far.
type progress struct {
	w     io.Writer
	label string // "export o1"
	total int64  // 0: unknown
	bytes bool   // counts bytes
	tty   bool   // rewrite one line (\r) rather than print lines
	eager bool   // --progress given: print from the start, and the end always
	start time.Time
	n     atomic.Int64

	mu      sync.Mutex
	printed bool
	stop    chan struct{}
	done    chan struct{}
}

// startProgress starts reporting label's progress on standard error as
// flag f says, and returns nil (which reports nothing) when it is off.
// counts says whether bytes will be counted (Add, reader, writer).
func startProgress(f progressFlag, label string, total int64, counts bool) *progress {
	tty := isTerminal(os.Stderr)
	if f.set && !f.on || !f.set && !tty {
		return nil
	}
	p := &progress{w: os.Stderr, label: label, total: total, bytes: counts, tty: tty, eager: f.set,
		start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer close(p.done)
	every := progressEvery
	if !p.tty {
		every = progressLogEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			if p.eager || now.Sub(p.start) >= progressDelay {
				p.print(p.line(now.Sub(p.start), false))
			}
		}
	}
}

func (p *progress) print(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
	p.printed = true
}

// Add counts n more bytes.
func (p *progress) Add(n int) {
	if p != nil {
		p.n.Add(int64(n))
	}
}

// Done ends the report: its last line says how it ended (err), when any
// line was printed before or --progress was given.
func (p *progress) Done(err error) {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	printed := p.printed
	p.mu.Unlock()
	if !printed && !p.eager {
		return
	}
	line := p.line(time.Since(p.start), true)
	if err != nil {
		line += ", failed"
	}
	p.print(line)
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// line is the progress after elapsed: "export o1: 12.0 MiB of 40.0 MiB
// (30%), 6.0 MiB/s, 5s left", or when final "export o1: 40.0 MiB in 6.7s,
// 6.0 MiB/s".
func (p *progress) line(elapsed time.Duration, final bool) string {
	n := p.n.Load()
	s := p.label + ": "
	if !p.bytes {
		if final {
			return s + "done in " + elapsed.Round(time.Millisecond).String()
		}
		return s + elapsed.Round(time.Second).String() + " so far"
	}
	rate := float64(0)
	if elapsed > 0 {
		rate = float64(n) / elapsed.Seconds()
	}
	if final {
		return fmt.Sprintf("%s%s in %s, %s/s", s, bytesString(n), elapsed.Round(time.Millisecond), bytesString(int64(rate)))
	}
	s += bytesString(n)
	if p.total > 0 {
		s += fmt.Sprintf(" of %s (%d%%)", bytesString(p.total), n*100/p.total)
	}
	s += fmt.Sprintf(", %s/s", bytesString(int64(rate)))
	if p.total > 0 && rate > 0 && n < p.total {
		left := time.Duration(float64(p.total-n) / rate * float64(time.Second))
		s += ", " + left.Round(time.Second).String() + " left"
	}
	return s
}

// Writer counts the bytes written through it to w.
func (p *progress) Writer(w io.Writer) io.Writer {
	if p == nil {
		return w
	}
	return progressWriter{w, p}
}

// Reader counts the bytes read through it from r.
func (p *progress) Reader(r io.Reader) io.Reader {
	if p == nil {
		return r
	}
	return progressReader{r, p}
}

type progressWriter struct {
	w io.Writer
	p *progress
}

func (w progressWriter) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	w.p.Add(n)
	return n, err
}

type progressReader struct {
	r io.Reader
	p *progress
}

func (r progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.Add(n)
	return n, err
}

// sizeOf is r's size when it is a regular file, else 0 (unknown).
func sizeOf(r io.Reader) int64 {
	f, ok := r.(*os.File)
	if !ok {
		return 0
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return 0
	}
	return st.Size()
}
