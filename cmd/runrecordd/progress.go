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
// error is a terminal or -o jsonl is asked for. Text goes to standard
// error only, so -o json prints one object on standard output whatever it
// is; with -o jsonl progress is events on standard output instead.
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

// progressFlags are --progress and --progress-every.
type progressFlags struct {
	report progressFlag
	every  time.Duration
}

func (f *progressFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.report, "progress", "report progress (bytes, rate, time left, or time so far): text on standard error, or events with -o jsonl; default: when standard error is a terminal or with -o jsonl, once the operation has taken a second (--progress: from the start, and the end always; --progress=false: never)")
	fs.DurationVar(&f.every, "progress-every", 0, "how often progress is reported (0: 500ms on a terminal, 1s as -o jsonl events, 5s elsewhere; at least 10ms)")
}

// check refuses a negative --progress-every.
func (f *progressFlags) check() error {
	if f.every < 0 {
		return usagef("--progress-every %s: a duration of 0 or more", f.every)
	}
	return nil
}

// progressDelay is how long an operation goes before progress is shown by
// default: a quick one reports nothing more.
const progressDelay = time.Second

// progressEvery is how often progress is rewritten on a terminal,
// progressEventEvery how often an event is written with -o jsonl, and
// progressLogEvery how often a line of it is printed elsewhere (a log);
// progressMinEvery bounds --progress-every.
const (
	progressEvery      = 500 * time.Millisecond
	progressEventEvery = time.Second
	progressLogEvery   = 5 * time.Second
	progressMinEvery   = 10 * time.Millisecond
)

// progress reports an operation's progress: bytes so far (Add, or a
// reader or writer wrapped by it), of total when known, with the rate and
// the time left; for an operation whose bytes this process does not see
// (a park, a migration), the time so far. It writes text lines on w, or
// with -o jsonl progress events on events.
type progress struct {
	w      io.Writer
	events *eventLines
	of     progressEvent // the operation: verb, and run or file
	total  int64         // 0: unknown
	bytes  bool          // counts bytes
	tty    bool          // rewrite one line (\r) rather than print lines
	eager  bool          // --progress given: report from the start, and the end always
	every  time.Duration
	start  time.Time
	n      atomic.Int64

	mu      sync.Mutex
	printed bool
	stop    chan struct{}
	done    chan struct{}
}

// startProgress starts reporting the progress of operation of (its verb,
// and run or file) as v's --progress flags and -o say, and returns nil
// (which reports nothing) when it is off. counts says whether bytes will
// be counted (Add, reader, writer); total is their number when known.
func (v *verb) startProgress(of progressEvent, total int64, counts bool) *progress {
	f := v.pf
	events := v.cf.output == "jsonl"
	tty := !events && isTerminal(os.Stderr)
	if f.report.set && !f.report.on || !f.report.set && !tty && !events {
		return nil
	}
	p := &progress{w: os.Stderr, of: of, total: total, bytes: counts, tty: tty, eager: f.report.set,
		every: f.every, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	if events {
		p.events = v.cf.events
	}
	switch {
	case p.every <= 0 && events:
		p.every = progressEventEvery
	case p.every <= 0 && tty:
		p.every = progressEvery
	case p.every <= 0:
		p.every = progressLogEvery
	case p.every < progressMinEvery:
		p.every = progressMinEvery
	}
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			if p.eager || now.Sub(p.start) >= progressDelay {
				p.report(p.event(now.Sub(p.start), false), false)
			}
		}
	}
}

// report writes e: as an event with -o jsonl, else as a line of text
// (failed: the operation failed).
func (p *progress) report(e progressEvent, failed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.printed = true
	if p.events != nil {
		_ = p.events.write(e)
		return
	}
	line := e.line()
	if failed {
		line += ", failed"
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		if e.Final {
			fmt.Fprintln(p.w)
		}
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// Add counts n more bytes.
func (p *progress) Add(n int) {
	if p != nil {
		p.n.Add(int64(n))
	}
}

// Done ends the report: its last line or event says how far it went, and
// its text how it ended (err), when any was reported before or --progress
// was given.
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
	p.report(p.event(time.Since(p.start), true), err != nil)
}

// progressEvent is a progress report: an event of -o jsonl as it is, and
// the figures of a line of text. Durations are in nanoseconds, as in the
// API's JSON.
type progressEvent struct {
	Event string `json:"event"` // "progress"
	Verb  string `json:"verb"`  // export, import, images import, park, migrate, drain
	Run   string `json:"run,omitempty"`
	File  string `json:"file,omitempty"` // import, images import: the file read (- for standard input)
	// Bytes is the bytes through this process so far, absent for an
	// operation whose bytes the daemon moves (park, migrate, drain).
	Bytes          *int64 `json:"bytes,omitempty"`
	TotalBytes     int64  `json:"total_bytes,omitempty"` // when known: an import of a regular file
	BytesPerSecond int64  `json:"bytes_per_second,omitempty"`
	ElapsedNS      int64  `json:"elapsed_ns"`
	LeftNS         int64  `json:"left_ns,omitempty"` // the time left at this rate, when the total is known
	// Detail is a drain's outcome for Run: moved to KEY, or why not.
	Detail string `json:"detail,omitempty"`
	// Final marks an operation's last progress event; its result or
	// error event follows.
	Final bool `json:"final,omitempty"`
}

// event is the progress after elapsed.
func (p *progress) event(elapsed time.Duration, final bool) progressEvent {
	e := p.of
	e.Event, e.ElapsedNS, e.Final = "progress", int64(elapsed), final
	if !p.bytes {
		return e
	}
	n := p.n.Load()
	e.Bytes, e.TotalBytes = &n, p.total
	if elapsed > 0 {
		e.BytesPerSecond = int64(float64(n) / elapsed.Seconds())
	}
	if !final && p.total > 0 && e.BytesPerSecond > 0 && n < p.total {
		e.LeftNS = int64(float64(p.total-n) / float64(e.BytesPerSecond) * float64(time.Second))
	}
	return e
}

// line is e as text: "export o1: 12.0 MiB of 40.0 MiB (30%), 6.0 MiB/s,
// 5s left", or when final "export o1: 40.0 MiB in 6.7s, 6.0 MiB/s".
func (e progressEvent) line() string {
	elapsed := time.Duration(e.ElapsedNS)
	s := e.Verb + " " + printable(e.Run+e.File) + ": "
	if e.Bytes == nil {
		if e.Final {
			return s + "done in " + elapsed.Round(time.Millisecond).String()
		}
		return s + elapsed.Round(time.Second).String() + " so far"
	}
	n := *e.Bytes
	if e.Final {
		return fmt.Sprintf("%s%s in %s, %s/s", s, bytesString(n), elapsed.Round(time.Millisecond), bytesString(e.BytesPerSecond))
	}
	s += bytesString(n)
	if e.TotalBytes > 0 {
		s += fmt.Sprintf(" of %s (%d%%)", bytesString(e.TotalBytes), n*100/e.TotalBytes)
	}
	s += fmt.Sprintf(", %s/s", bytesString(e.BytesPerSecond))
	if e.LeftNS > 0 {
		s += ", " + time.Duration(e.LeftNS).Round(time.Second).String() + " left"
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
