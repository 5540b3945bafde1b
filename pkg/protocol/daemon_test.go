package protocol_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// daemon is a map-backed Handler that keeps a run's calls the way the
// daemon does: every call dispatched in the run, results posted by the
// platform and not yet delivered, results delivered to the current
// interval, and the call account of every interval so far.
type daemon struct {
	mu         sync.Mutex
	run        string
	interval   int64
	transcript string // path of the current interval's transcript file

	dispatched map[string]protocol.Call   // every call of the run
	order      []string                   // ids in dispatch order
	posted     map[string]protocol.Result // posted, not yet delivered
	delivered  []protocol.Result          // delivered to this interval
	resolved   map[string]bool            // delivered to an earlier interval
	awaiting   []string

	cur      record.CallAccount   // this interval's account
	accounts []record.CallAccount // ended intervals

	parks      chan []string // an await that parked sends its ids
	onDispatch func(id string)
}

func newDaemon(transcript string) *daemon {
	return &daemon{
		run:        "run-1",
		interval:   1,
		transcript: transcript,
		dispatched: map[string]protocol.Call{},
		posted:     map[string]protocol.Result{},
		resolved:   map[string]bool{},
		cur:        record.CallAccount{Dispatched: []string{}, Resolved: []string{}},
		parks:      make(chan []string, 1),
	}
}

func (d *daemon) Hello(context.Context) (protocol.Hello, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return protocol.Hello{Run: d.run, Interval: d.interval}, nil
}

func (d *daemon) Append(_ context.Context, data []byte) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, err := os.OpenFile(d.transcript, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), f.Close()
}

func (d *daemon) Dispatch(_ context.Context, c protocol.Call) error {
	if d.onDispatch != nil {
		d.onDispatch(c.ID)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.dispatched[c.ID]; ok {
		return fmt.Errorf("call %s: %w", c.ID, protocol.ErrDuplicateCall)
	}
	if len(d.cur.Dispatched) >= record.MaxCalls {
		return fmt.Errorf("call %s: %w", c.ID, protocol.ErrTooManyCalls)
	}
	d.dispatched[c.ID] = c
	d.order = append(d.order, c.ID)
	d.cur.Dispatched = append(d.cur.Dispatched, c.ID)
	return nil
}

// known refuses an id never dispatched or resolved in an earlier interval.
func (d *daemon) known(id string) error {
	if _, ok := d.dispatched[id]; !ok {
		return fmt.Errorf("call %s: %w", id, protocol.ErrUnknownCall)
	}
	if d.resolved[id] {
		return fmt.Errorf("call %s: %w", id, protocol.ErrResolved)
	}
	return nil
}

func (d *daemon) isDelivered(id string) bool {
	return slices.ContainsFunc(d.delivered, func(r protocol.Result) bool { return r.ID == id })
}

func (d *daemon) Await(_ context.Context, ids []string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	all := true
	for _, id := range ids {
		if err := d.known(id); err != nil {
			return false, err
		}
		all = all && d.isDelivered(id)
	}
	if all {
		return false, nil
	}
	d.awaiting = slices.Clone(ids)
	select {
	case d.parks <- d.awaiting:
	default:
	}
	return true, nil
}

func (d *daemon) Results(context.Context) ([]protocol.Result, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.delivered), nil
}

func (d *daemon) Result(_ context.Context, id string) (protocol.Result, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.known(id); err != nil {
		return protocol.Result{}, false, err
	}
	for _, r := range d.delivered {
		if r.ID == id {
			return r, true, nil
		}
	}
	r, ok := d.posted[id]
	if !ok {
		return protocol.Result{}, false, nil
	}
	delete(d.posted, id)
	d.delivered = append(d.delivered, r)
	d.cur.Resolved = append(d.cur.Resolved, id)
	return r, true, nil
}

// post is the platform posting a call's result.
func (d *daemon) post(id string, payload string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.known(id); err != nil {
		return err
	}
	if _, ok := d.posted[id]; ok || d.isDelivered(id) {
		return fmt.Errorf("call %s: %w", id, protocol.ErrResolved)
	}
	d.posted[id] = protocol.Result{ID: id, Payload: json.RawMessage(payload)}
	return nil
}

// resume ends the interval and starts the next with transcript as its
// file, delivering the awaited results that are posted.
func (d *daemon) resume(transcript string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.accounts = append(d.accounts, d.cur)
	for _, r := range d.delivered {
		d.resolved[r.ID] = true
	}
	d.interval++
	d.transcript = transcript
	d.cur = record.CallAccount{Dispatched: []string{}, Resolved: []string{}}
	d.delivered = nil
	for _, id := range d.awaiting {
		if r, ok := d.posted[id]; ok {
			delete(d.posted, id)
			d.delivered = append(d.delivered, r)
			d.cur.Resolved = append(d.cur.Resolved, id)
		}
	}
	d.awaiting = nil
}

// proof is the wait proof of the intervals ended so far and the current
// one.
func (d *daemon) proof() record.Verdict {
	d.mu.Lock()
	defer d.mu.Unlock()
	var segs []record.Segment
	for _, a := range append(slices.Clone(d.accounts), d.cur) {
		segs = append(segs, record.Segment{Kind: record.Executed, Calls: &a})
	}
	return record.Proof(segs)
}

func (d *daemon) dispatches() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.order)
}

// mustTranscript creates an empty transcript file in dir.
func mustTranscript(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, protocol.TranscriptFile)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// mustServe serves h on a unix socket in dir and returns its path. The
// cleanup closes the server and checks Serve returned ErrServerClosed.
func mustServe(t *testing.T, dir string, h protocol.Handler) (string, *protocol.Server) {
	t.Helper()
	path := filepath.Join(dir, protocol.SocketFile)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := protocol.NewServer(h)
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-served; !errors.Is(err, protocol.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return path, s
}

// mustDial dials path and closes the client at cleanup.
func mustDial(t *testing.T, path string) *protocol.Client {
	t.Helper()
	c, err := protocol.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// mustDaemon is a daemon serving in a fresh directory.
func mustDaemon(t *testing.T) (*daemon, string, *protocol.Server) {
	t.Helper()
	dir := t.TempDir()
	d := newDaemon(mustTranscript(t, dir))
	sock, s := mustServe(t, dir, d)
	return d, sock, s
}
