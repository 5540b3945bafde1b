package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runrecordd/runrecordd/internal/interval"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/store"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// testChannel is a channel with its transcript and spool in a temporary
// directory, no socket, and lim (defaults filled in).
func testChannel(t *testing.T, lim unit.Limits) *channel {
	t.Helper()
	dir := t.TempDir()
	ch := &channel{d: &Daemon{cfg: Config{StateDir: dir}}, id: "r", dir: dir, lim: lim.Or(unit.DefaultLimits),
		seen: map[string]bool{}, outstanding: map[string]bool{}, dispatchAt: map[string]spoolRef{},
		spoolPath: filepath.Join(dir, "spool")}
	var err error
	if ch.transcript, err = os.OpenFile(ch.transcriptPath(), os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o644); err != nil {
		t.Fatal(err)
	}
	if ch.spool, err = os.Create(ch.spoolPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.closeFiles() })
	return ch
}

// TestChannelLimits: an append past the transcript limit, and an append or
// a dispatch past the interval's payload limit, are refused with their
// codes and leave the transcript, the journal and the account as they
// were; what fits goes through.
func TestChannelLimits(t *testing.T) {
	ctx := context.Background()
	ch := testChannel(t, unit.Limits{TranscriptBytes: 10, IntervalPayloadBytes: 100, IntervalCalls: 2})
	if n, err := ch.Append(ctx, []byte("0123456789")); err != nil || n != 10 {
		t.Fatalf("append to the limit: %d, %v", n, err)
	}
	state := func() string {
		b, _ := os.ReadFile(ch.transcriptPath())
		n, _ := ch.spooled()
		return fmt.Sprintf("%q size %d spooled %d payload %d dispatched %v", b, ch.size, n, ch.payload, ch.dispatched)
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
	if call, ok := ch.dispatchedCall("c2"); !ok || call.ID != "c2" || call.Kind != "k" {
		t.Fatalf("dispatched c2 reads back as %+v, %v", call, ok)
	}
	// The big call was refused: a retry with a smaller payload is a new
	// dispatch, not a duplicate.
	if ch.seen["big"] {
		t.Fatal("a refused dispatch was recorded as seen")
	}
}

// TestJournalStream: the journal end streams from the lifecycle entries,
// the channel's spool and the tail is byte for byte what
// attest.Journal.Encode makes of the same entries.
func TestJournalStream(t *testing.T) {
	ctx := context.Background()
	ch := testChannel(t, unit.Limits{})
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
	n, r := ch.spooled()
	got, err := io.ReadAll(interval.JournalReader(len(pre)+n+len(tail), bytes.NewReader(interval.EncodeEntries(pre)), r, bytes.NewReader(interval.EncodeEntries(tail))))
	if err != nil {
		t.Fatal(err)
	}
	j, err := attest.DecodeJournal(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Entries) != 6 || string(j.Entries[1].Data) != "line\n" || j.Entries[2].Kind != attest.Dispatch ||
		!bytes.Equal(j.Entries[3].Data, []byte{0xff, 0}) || string(j.Entries[4].Data) != "out" {
		t.Fatalf("journal entries %+v", j.Entries)
	}
	if !bytes.Equal(got, j.Encode()) {
		t.Fatal("the streamed journal is not the journal's encoding")
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
			f, err := readTranscript(dir, rel, 10)
			if err == nil {
				f.Close()
			}
			if !errors.Is(err, ErrTranscript) {
				t.Fatalf("readTranscript = %v, want ErrTranscript", err)
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
	if f, err := readTranscript(dir, rel, 10); !errors.Is(err, ErrTranscript) {
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
	f, err := readTranscript(dir, rel, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, _ := io.ReadAll(f); string(b) != "transcript" {
		t.Fatalf("read %q", b)
	}
	if _, err := readTranscript(dir, "nosuch", 10); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing transcript: %v", err)
	}
}

// TestResultName: every call id the protocol takes names a result file
// within NAME_MAX, distinct from every other's.
func TestResultName(t *testing.T) {
	a, b := strings.Repeat("i", protocol.MaxIDLen), strings.Repeat("i", protocol.MaxIDLen-1)+"j"
	if len(resultName(a)) > 255 || resultName(a) == resultName(b) {
		t.Fatalf("%q, %q", resultName(a), resultName(b))
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, resultName(a)), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestScanJournal: a journal read as a stream gives the entries of the
// kinds asked for, in order, and a journal object whose bytes no longer
// match its address is an error, not entries.
func TestScanJournal(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key, err := attest.LoadOrCreateKey(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{st: st}
	j := attest.Journal{}
	j.Add(attest.Lifecycle, 1, []byte("started"))
	j.Add(attest.Dispatch, 2, []byte(`{"id":"c1","kind":"k","payload":null}`))
	j.Add(attest.Stdout, 3, bytes.Repeat([]byte("o"), 100<<10))
	j.Add(attest.Lifecycle, 4, []byte(`await ["c1"]`))
	jAddr, err := st.PutBytes(j.Encode())
	if err != nil {
		t.Fatal(err)
	}
	signed, err := attest.Sign(&attest.Body{Interval: 1, Journal: jAddr, Receipt: jAddr, Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum([]byte("suspended"))}}, key)
	if err != nil {
		t.Fatal(err)
	}
	att, err := st.PutBytes(signed.Encode())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = d.scanJournal(att, []attest.EntryKind{attest.Lifecycle, attest.Dispatch}, func(e attest.Entry) {
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
	if err := d.scanJournal(att, []attest.EntryKind{attest.Lifecycle}, func(attest.Entry) {}); err == nil {
		t.Fatal("a corrupted journal scanned without an error")
	}
}

// TestOutstandingCallsBounded: calls outstanding from earlier intervals
// count against a run's call limit, so a unit that dispatches and never
// awaits cannot pile calls (and their payloads, which the daemon holds for
// GET /v1/calls) up interval after interval.
func TestOutstandingCallsBounded(t *testing.T) {
	ctx := context.Background()
	ch := testChannel(t, unit.Limits{IntervalCalls: 3})
	// Two calls left outstanding by an earlier interval.
	ch.seen["old-1"], ch.outstanding["old-1"] = true, true
	ch.seen["old-2"], ch.outstanding["old-2"] = true, true
	if err := ch.Dispatch(ctx, protocol.Call{ID: "c1", Kind: "k"}); err != nil {
		t.Fatalf("dispatch within the limit: %v", err)
	}
	if err := ch.Dispatch(ctx, protocol.Call{ID: "c2", Kind: "k"}); !errors.Is(err, protocol.ErrTooManyCalls) {
		t.Fatalf("a fourth outstanding call: %v, want too_many_calls", err)
	}
}
