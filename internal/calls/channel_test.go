package calls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// TestChannelLimits: an append past the transcript limit, and an append or
// a dispatch past the interval's payload limit, are refused with their
// codes and leave the transcript, the journal, the account and the ledger
// as they were; what fits goes through.
func TestChannelLimits(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{TranscriptBytes: 10, IntervalPayloadBytes: 100, IntervalCalls: 2}, nil)
	if n, err := ch.Append(ctx, []byte("0123456789")); err != nil || n != 10 {
		t.Fatalf("append to the limit: %d, %v", n, err)
	}
	state := func() string {
		b, _ := os.ReadFile(ch.transcriptPath())
		n, _ := ch.Spooled()
		l, _ := st.Calls("r")
		return fmt.Sprintf("%q size %d spooled %d payload %d dispatched %v ledger %d", b, ch.size, n, ch.payload, ch.dispatched, len(l.Calls))
	}
	was := state()
	if _, err := ch.Append(ctx, []byte("x")); !errors.Is(err, protocol.ErrTranscriptFull) || protocol.Code(err) != "transcript_full" {
		t.Fatalf("append past the transcript limit: %v", err)
	}
	if err := ch.Dispatch(ctx, protocol.Call{ID: "big", Kind: "k", Payload: []byte(`"` + strings.Repeat("p", 100) + `"`)}); !errors.Is(err, protocol.ErrPayloadLimit) || protocol.Code(err) != "payload_limit" {
		t.Fatalf("dispatch past the payload limit: %v", err)
	}
	if now := state(); now != was {
		t.Fatalf("refusals changed the channel: %s, was %s", now, was)
	}
	for _, id := range []string{"c1", "c2"} {
		if err := ch.Dispatch(ctx, protocol.Call{ID: id, Kind: "k"}); err != nil {
			t.Fatalf("dispatch %s: %v", id, err)
		}
	}
	if err := ch.Dispatch(ctx, protocol.Call{ID: "c3", Kind: "k"}); !errors.Is(err, protocol.ErrTooManyCalls) {
		t.Fatalf("dispatch past the call limit: %v", err)
	}
	c2, ok, err := st.Call("r", "c2")
	if err != nil || !ok || c2.Kind != "k" || c2.Interval != 1 || !c2.Open {
		t.Fatalf("ledger's c2: %+v %v %v", c2, ok, err)
	}
	if b, err := st.ReadAll(c2.Payload); err != nil || string(b) != `{"id":"c2","kind":"k","payload":null}` {
		t.Fatalf("c2's call object: %s %v", b, err)
	}
	// The big call was refused: a retry with a smaller payload is a new
	// dispatch, not a duplicate.
	if _, ok, _ := st.Call("r", "big"); ok {
		t.Fatal("a refused dispatch is in the ledger")
	}
}

// TestDispatchLimit holds an interval's dispatches to what one account can
// record: the call after the last one fits is refused, and the account
// stays recordable.
func TestDispatchLimit(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	for i := range record.MaxCalls {
		if err := ch.Dispatch(ctx, protocol.Call{ID: fmt.Sprintf("c%d", i), Kind: "k"}); err != nil {
			t.Fatalf("dispatch %d: %v", i, err)
		}
	}
	if err := ch.Dispatch(ctx, protocol.Call{ID: "one-more", Kind: "k"}); !errors.Is(err, protocol.ErrTooManyCalls) {
		t.Fatalf("dispatch past the limit: %v, want ErrTooManyCalls", err)
	}
	if err := record.Execution(record.Sum([]byte("att")), ch.Account()).Validate(); err != nil {
		t.Fatalf("the account at the limit does not record: %v", err)
	}
	park(t, st, "r", ch)
}

// TestOutstandingCallsBounded: calls outstanding from earlier intervals
// count against a run's call limit, so a unit that dispatches and never
// awaits cannot pile calls (and their objects, which the ledger keeps for
// GET /v1/calls) up interval after interval; their call objects count
// against the interval's payload.
func TestOutstandingCallsBounded(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{IntervalCalls: 3}, nil)
	for _, id := range []string{"old-1", "old-2"} {
		if err := ch.Dispatch(ctx, protocol.Call{ID: id, Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	snap := park(t, st, "r", ch)
	appendSegs(t, st, "r", record.Resumption(snap, 1, record.Estimated))
	ch, _ = openChannel(t, st, "r", unit.Limits{IntervalCalls: 3}, snap.Transcript)
	if ch.Interval() != 2 || ch.payload != uint64(2*len(`{"id":"old-1","kind":"k","payload":null}`)) {
		t.Fatalf("interval %d, payload %d", ch.Interval(), ch.payload)
	}
	if err := ch.Dispatch(ctx, protocol.Call{ID: "c1", Kind: "k"}); err != nil {
		t.Fatalf("dispatch within the limit: %v", err)
	}
	if err := ch.Dispatch(ctx, protocol.Call{ID: "c2", Kind: "k"}); !errors.Is(err, protocol.ErrTooManyCalls) {
		t.Fatalf("a fourth outstanding call: %v, want too_many_calls", err)
	}
}

// TestJournalStream: the journal end streams from the lifecycle entries,
// the channel's spool and the tail is byte for byte what
// attest.Journal.Encode makes of the same entries.
func TestJournalStream(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, _ := openChannel(t, st, "r", unit.Limits{}, nil)
	if _, err := ch.Append(ctx, []byte("line\n")); err != nil {
		t.Fatal(err)
	}
	if err := ch.Dispatch(ctx, protocol.Call{ID: "c1", Kind: "k", Payload: []byte(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Append(ctx, []byte{0xff, 0}); err != nil {
		t.Fatal(err)
	}
	pre := []attest.Entry{{Kind: attest.Lifecycle, AtNS: 1, Data: []byte("started")}}
	tail := []attest.Entry{{Kind: attest.Stdout, AtNS: 2, Data: []byte("out")}, {Kind: attest.Lifecycle, AtNS: 3, Data: []byte("x")}}
	n, r := ch.Spooled()
	got, err := io.ReadAll(attest.JournalReader(len(pre)+n+len(tail), bytes.NewReader(attest.EncodeEntries(pre)), r, bytes.NewReader(attest.EncodeEntries(tail))))
	if err != nil {
		t.Fatal(err)
	}
	j, err := attest.DecodeJournal(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Entries) != 6 || string(j.Entries[1].Data) != "line\n" || j.Entries[2].Kind != attest.Dispatch ||
		string(j.Entries[2].Data) != `{"id":"c1","kind":"k","payload":{"a":1}}` ||
		!bytes.Equal(j.Entries[3].Data, []byte{0xff, 0}) || string(j.Entries[4].Data) != "out" {
		t.Fatalf("journal entries %+v", j.Entries)
	}
	if !bytes.Equal(got, j.Encode()) {
		t.Fatal("the streamed journal is not the journal's encoding")
	}
}

// TestSocket: a unit speaks to the channel over its socket, as a sandbox
// does: hello, append, dispatch, await.
func TestSocket(t *testing.T) {
	ctx := t.Context()
	st := mustStore(t)
	newRun(t, st, "r")
	ch, h := openChannel(t, st, "r", unit.Limits{}, nil)
	go ch.Serve()
	c, err := protocol.Dial(filepath.Join(ch.Dir(), protocol.SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if hello, err := c.Hello(ctx); err != nil || hello.Run != "r" || hello.Interval != 1 {
		t.Fatalf("hello %+v %v", hello, err)
	}
	if n, err := c.Append(ctx, []byte("step 1\n")); err != nil || n != 7 {
		t.Fatalf("append %d %v", n, err)
	}
	if err := c.Dispatch(ctx, protocol.Call{ID: "call-1", Kind: "build", Payload: []byte(`{"target": "all"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Dispatch(ctx, protocol.Call{ID: "call-1", Kind: "build"}); !errors.Is(err, protocol.ErrDuplicateCall) {
		t.Fatalf("a second dispatch of call-1: %v", err)
	}
	if parking, err := c.Await(ctx, "call-1"); err != nil || !parking {
		t.Fatalf("await: %v %v", parking, err)
	}
	if said, awaiting := h.said(); len(said) != 1 || said[0] != "r/call-1:build" || awaiting != 1 {
		t.Fatalf("the host was told %v and %d awaits", said, awaiting)
	}
	b, _ := os.ReadFile(ch.transcriptPath())
	if string(b) != "step 1\n" {
		t.Fatalf("transcript %q", b)
	}
}

// TestOpenBeneath: restart recovery reads a transcript only when it is a
// regular file the daemon could have made, beneath the state directory,
// with no symlink anywhere on its path; a FIFO is refused without waiting
// for a writer, a device or a file past the limit without reading it.
func TestOpenBeneath(t *testing.T) {
	dir := t.TempDir()
	ch := filepath.Join(dir, "ch", "r")
	if err := os.MkdirAll(ch, 0o700); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(host, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	rel := filepath.Join("ch", "r", "transcript")
	p := filepath.Join(dir, rel)
	for _, c := range []struct {
		name string
		make func() error
	}{
		{"symlink to a host file", func() error { return os.Symlink(host, p) }},
		{"symlink to /dev/zero", func() error { return os.Symlink("/dev/zero", p) }},
		{"fifo", func() error { return syscall.Mkfifo(p, 0o600) }},
		{"directory", func() error { return os.Mkdir(p, 0o700) }},
		{"hard link", func() error {
			o := filepath.Join(dir, "other")
			if err := os.WriteFile(o, []byte("x"), 0o600); err != nil {
				return err
			}
			return os.Link(o, p)
		}},
		{"too large", func() error { return os.WriteFile(p, make([]byte, 11), 0o600) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.RemoveAll(p)
			if err := c.make(); err != nil {
				t.Fatal(err)
			}
			f, err := ReadTranscript(dir, rel, 10)
			if err == nil {
				f.Close()
			}
			if !errors.Is(err, ErrTranscript) {
				t.Fatalf("ReadTranscript = %v, want ErrTranscript", err)
			}
		})
	}
	// A symlink on the path, not at its end.
	os.RemoveAll(ch)
	if err := os.Symlink(filepath.Dir(host), ch); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(host, filepath.Join(filepath.Dir(host), "transcript")); err != nil {
		t.Fatal(err)
	}
	if f, err := ReadTranscript(dir, rel, 10); !errors.Is(err, ErrTranscript) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("through a symlinked directory: %v", err)
	}
	os.Remove(ch)
	if err := os.MkdirAll(ch, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("transcript"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := ReadTranscript(dir, rel, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, _ := io.ReadAll(f); string(b) != "transcript" {
		t.Fatalf("read %q", b)
	}
	if _, err := ReadTranscript(dir, "nosuch", 10); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing transcript: %v", err)
	}
}

// TestScanJournal: a journal read as a stream gives the entries of the
// kinds asked for, in order, and a journal object whose bytes no longer
// match its address is an error, not entries.
func TestScanJournal(t *testing.T) {
	st := mustStore(t)
	j := attest.Journal{}
	j.Add(attest.Lifecycle, 1, []byte("started"))
	j.Add(attest.Dispatch, 2, []byte(`{"id":"c1","kind":"k","payload":null}`))
	j.Add(attest.Stdout, 3, bytes.Repeat([]byte("o"), 100<<10))
	j.Add(attest.Lifecycle, 4, []byte(`await ["c1"]`))
	jAddr := put(t, st, string(j.Encode()))
	att := sign(t, st, 1, jAddr)
	var got []string
	err := scanJournal(st, att, []attest.EntryKind{attest.Lifecycle, attest.Dispatch}, func(e attest.Entry) {
		got = append(got, fmt.Sprintf("%d:%s", e.Kind, e.Data))
	})
	if want := `3:started 5:{"id":"c1","kind":"k","payload":null} 3:await ["c1"]`; err != nil || strings.Join(got, " ") != want {
		t.Fatalf("scanJournal = %q, %v; want %s", got, err, want)
	}
	b, err := os.ReadFile(st.Path(jAddr))
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	os.Chmod(st.Path(jAddr), 0o600)
	if err := os.WriteFile(st.Path(jAddr), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := scanJournal(st, att, []attest.EntryKind{attest.Lifecycle}, func(attest.Entry) {}); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("a corrupted journal scanned: %v", err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(st.Path(jAddr), b, 0o400); err != nil {
		t.Fatal(err)
	}
}
