package runlog

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/pkg/attest"
)

// fakeRun is a run's output as a test drives it: sealed journals, and an
// open interval over files in a directory.
type fakeRun struct {
	mu       sync.Mutex
	journals [][]byte
	open     *Open
	done     bool
	busy     bool
}

func (f *fakeRun) State() (State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.busy {
		return State{}, ErrBusy
	}
	st := State{Sealed: len(f.journals), Done: f.done}
	if f.open != nil {
		o := *f.open
		for i, p := range []string{o.Files.Stdout, o.Files.Stderr} {
			fi, err := os.Stat(p)
			if err != nil {
				return State{}, err
			}
			o.Until[i] = fi.Size()
		}
		st.Open = &o
	}
	return st, nil
}

func (f *fakeRun) Journal(k int) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return io.NopCloser(bytes.NewReader(f.journals[k-1])), nil
}

func journal(at int64, stdout, stderr string, es ...attest.Entry) []byte {
	var j attest.Journal
	j.Entries = append(j.Entries, attest.Event(at, "started"))
	j.Entries = append(j.Entries, es...)
	if stdout != "" {
		j.Add(attest.Stdout, at, []byte(stdout))
	}
	if stderr != "" {
		j.Add(attest.Stderr, at, []byte(stderr))
	}
	return j.Encode()
}

func files(t *testing.T) interval.Output {
	dir := t.TempDir()
	out := interval.Output{Stdout: filepath.Join(dir, "stdout"), Stderr: filepath.Join(dir, "stderr")}
	for _, p := range []string{out.Stdout, out.Stderr} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func appendFile(t *testing.T, p, s string) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// show renders chunks one per line: interval, stream, then data or mark.
func show(cs []Chunk) string {
	var b strings.Builder
	for _, c := range cs {
		if c.Reason != "" {
			fmt.Fprintf(&b, "%d %s omitted %d %s\n", c.Interval, StreamName(c.Stream), c.Omitted, c.Reason)
			continue
		}
		fmt.Fprintf(&b, "%d %s %q\n", c.Interval, StreamName(c.Stream), c.Data)
	}
	return b.String()
}

func collect(t *testing.T, src Source, opt Options) string {
	t.Helper()
	var cs []Chunk
	err := Read(context.Background(), src, opt, func(c Chunk) error {
		c.Data = bytes.Clone(c.Data)
		cs = append(cs, c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return show(cs)
}

func TestReadAcrossIntervals(t *testing.T) {
	out := files(t)
	appendFile(t, out.Stdout, "old\nthree\n")
	appendFile(t, out.Stderr, "e3\n")
	src := &fakeRun{journals: [][]byte{
		journal(100, "one\ntwo\n", "err one\n"),
		journal(200, "kept\ncut", "",
			attest.LifecycleOf(200, attest.OutputOmitted{Stream: attest.Stdout, FromOffset: 8, Bytes: 5}),
			attest.LifecycleOf(200, attest.OutputDiscarded{StderrBytes: 7, LimitBytes: 10})),
	}, open: &Open{Files: out, From: [2]int64{4, 0}}}
	want := `1 stdout "one\n"
1 stdout "two\n"
1 stderr "err one\n"
2 stdout omitted 5 journal-cap
2 stderr omitted 7 log-limit
2 stdout "kept\n"
2 stdout "cut"
3 stdout "three\n"
3 stderr "e3\n"
`
	if got := collect(t, src, Options{Tail: -1}); got != want {
		t.Errorf("all:\n%s\nwant:\n%s", got, want)
	}
	// The last 3 lines: "cut" is cut at its interval's end, a line.
	wantTail := `2 stdout "cut"
3 stdout "three\n"
3 stderr "e3\n"
`
	if got := collect(t, src, Options{Tail: 3}); got != wantTail {
		t.Errorf("tail 3:\n%s\nwant:\n%s", got, wantTail)
	}
	if got := collect(t, src, Options{Tail: 0}); got != "" {
		t.Errorf("tail 0: %s", got)
	}
	// Since leaves out sealed intervals recorded before it; the open
	// interval comes whole.
	wantSince := `2 stdout omitted 5 journal-cap
2 stderr omitted 7 log-limit
2 stdout "kept\n"
2 stdout "cut"
3 stdout "three\n"
3 stderr "e3\n"
`
	if got := collect(t, src, Options{Tail: -1, Since: time.Unix(0, 150)}); got != wantSince {
		t.Errorf("since:\n%s\nwant:\n%s", got, wantSince)
	}
}

// A follow delivers each line once across a park (the open interval
// sealed: its journal holds what was read from its file), a resume (a new
// interval from the file's new end) and the close.
func TestFollowAcrossPark(t *testing.T) {
	out := files(t)
	appendFile(t, out.Stdout, "a1\n")
	src := &fakeRun{open: &Open{Files: out}}
	lines := make(chan string, 100)
	errc := make(chan error, 1)
	go func() {
		errc <- Read(context.Background(), src, Options{Tail: -1, Follow: true, Poll: time.Millisecond}, func(c Chunk) error {
			lines <- fmt.Sprintf("%d %s %s", c.Interval, StreamName(c.Stream), c.Data)
			return nil
		})
	}()
	next := func(want string) {
		t.Helper()
		select {
		case got := <-lines:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no line; want %q", want)
		}
	}
	next("1 stdout a1\n")
	appendFile(t, out.Stdout, "a2\n")
	next("1 stdout a2\n")

	// Park: the unit wrote a3 and a4 after the last poll; the journal
	// holds the interval's whole output, a1 to a4.
	src.mu.Lock()
	src.busy = true
	src.mu.Unlock()
	appendFile(t, out.Stdout, "a3\n")
	appendFile(t, out.Stderr, "e1\n")
	src.mu.Lock()
	src.journals = append(src.journals, journal(1, "a1\na2\na3\n", "e1\n"))
	src.open, src.busy = nil, false
	src.mu.Unlock()
	next("1 stdout a3\n")
	next("1 stderr e1\n")

	// Resume: the next interval starts at the files' ends.
	src.mu.Lock()
	src.open = &Open{Files: out, From: [2]int64{9, 3}}
	src.mu.Unlock()
	appendFile(t, out.Stdout, "b1\n")
	next("2 stdout b1\n")

	// Close: the interval sealed with b2, then done.
	src.mu.Lock()
	appendFile(t, out.Stdout, "b2\n")
	src.journals = append(src.journals, journal(2, "b1\nb2\n", ""))
	src.open, src.done = nil, true
	src.mu.Unlock()
	next("2 stdout b2\n")
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the follow did not end at the close")
	}
	if len(lines) != 0 {
		t.Fatalf("more lines: %q", <-lines)
	}
}

// A follow ends with its context.
func TestFollowEndsWithContext(t *testing.T) {
	src := &fakeRun{}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := Read(ctx, src, Options{Tail: -1, Follow: true, Poll: time.Millisecond}, func(Chunk) error { return nil })
	if err != context.DeadlineExceeded {
		t.Fatalf("err %v, want the context's", err)
	}
}

// A journal that is not one is an error, not output.
func TestReadBadJournal(t *testing.T) {
	src := &fakeRun{journals: [][]byte{[]byte("runrecordd.journal/1\x00\x00\x00\x05\x01")}}
	err := Read(context.Background(), src, Options{Tail: -1}, func(Chunk) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("err %v, want malformed", err)
	}
}

// A journal's mark claiming more than any output is not taken: no sum
// overflows, and the output after it still comes.
func TestReadHostileMark(t *testing.T) {
	src := &fakeRun{journals: [][]byte{journal(1, "a\n", "",
		attest.LifecycleOf(1, attest.OutputOmitted{Stream: attest.Stdout, Bytes: 1<<63 - 1}),
		attest.LifecycleOf(1, attest.OutputOmitted{Stream: attest.Stdout, Bytes: -5}))}}
	if got, want := collect(t, src, Options{Tail: -1}), "1 stdout \"a\\n\"\n"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// bigJournal streams a journal of n copies of one stdout entry, made as
// it is read: the test holds one entry, not the journal.
type bigJournal struct {
	n, i        int
	head, entry []byte
	buf         []byte
}

func (b *bigJournal) Read(p []byte) (int, error) {
	if len(b.buf) == 0 {
		switch {
		case b.i == 0:
			b.buf = b.head
		case b.i <= b.n:
			b.buf = b.entry
		default:
			return 0, io.EOF
		}
		b.i++
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	return n, nil
}

type bigRun struct {
	n           int
	head, entry []byte
}

func (r bigRun) State() (State, error) { return State{Sealed: 1, Done: true}, nil }
func (r bigRun) Journal(int) (io.ReadCloser, error) {
	return io.NopCloser(&bigJournal{n: r.n, head: r.head, entry: r.entry}), nil
}

// Reading 256 MiB of output allocates a small fraction of it: no log is
// held whole.
func TestReadBoundedMemory(t *testing.T) {
	const entries = 4096 // of 64 KiB: 256 MiB
	head, err := io.ReadAll(attest.JournalReader(entries))
	if err != nil {
		t.Fatal(err)
	}
	src := bigRun{n: entries, head: head, entry: attest.AppendEntry(nil, attest.Stdout, 1, bytes.Repeat([]byte("0123456789abcde\n"), MaxPiece/16))}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var lines, size int64
	err = Read(context.Background(), src, Options{Tail: 10}, func(c Chunk) error {
		lines++
		size += int64(len(c.Data))
		return nil
	})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if lines != 10 || size != 160 {
		t.Fatalf("tail 10: %d lines, %d bytes", lines, size)
	}
	// Two passes over 256 MiB (the tail counts first).
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("2 × %d MiB of output read with %d KiB allocated", entries*MaxPiece>>20, alloc>>10)
	if alloc > 32<<20 { // the race detector allocates about 2 KiB an entry
		t.Fatalf("reading %d MiB of output allocated %d MiB", entries*MaxPiece>>20, alloc>>20)
	}
}
