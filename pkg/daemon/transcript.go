package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/interval"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/manifest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ProtocolVersion is the transcript channel's protocol, which a transcript
// park's environment manifest records.
const ProtocolVersion = protocol.Version

// ChannelMount is where a transcript unit finds its channel directory.
const ChannelMount = protocol.Dir

// channel is a transcript unit's directory on this host — its transcript
// and its socket — and the protocol.Handler behind the socket for one
// interval: it keeps the interval's call account and journal entries.
//
// The directory is mounted read-only in the sandbox: the unit reads its
// transcript there and connects to the socket, and changes nothing. The
// daemon holds the transcript by the descriptor it created it with and
// never opens it by path again while it serves the channel; the
// interval's journal entries are spooled to a file in the daemon's own
// state directory, not held in memory.
type channel struct {
	d   *Daemon
	id  string
	dir string
	ln  net.Listener
	srv *protocol.Server
	lim unit.Limits // the run's limits, defaults filled in

	// gate is held by every handler call, and by a park while it seals
	// the transcript and records the interval: no append or dispatch can
	// slip in between, and if the park is refused the unit goes on.
	gate sync.Mutex

	mu          sync.Mutex
	interval    int64
	seen        map[string]bool // every call id the run dispatched
	outstanding map[string]bool // dispatched, not yet resolved
	dispatched  []string        // this interval's account
	resolved    []string
	delivered   []protocol.Result // results resolved in this interval, in order
	awaiting    []string
	closed      bool // the interval is over: every call is refused

	transcript *os.File // opened once, O_APPEND; sealed from here
	size       int64    // the transcript's size
	payload    uint64   // append and dispatch bytes of this interval

	spool      *os.File // this interval's journal entries, encoded
	spoolPath  string
	spoolN     int
	spoolSize  int64
	dispatchAt map[string]spoolRef // where each dispatch's call is spooled
}

// spoolRef is where an entry's data lies in the spool.
type spoolRef struct{ off, n int64 }

// calls is what a run's record says of its calls: every id dispatched, and
// those not yet resolved.
type calls struct {
	seen, outstanding map[string]bool
	intervals         int64
}

func callsOf(segs []record.Segment) calls {
	c := calls{seen: map[string]bool{}, outstanding: map[string]bool{}}
	for _, s := range segs {
		if s.Kind != record.Executed {
			continue
		}
		c.intervals++
		if s.Calls == nil {
			continue
		}
		for _, id := range s.Calls.Dispatched {
			c.seen[id], c.outstanding[id] = true, true
		}
		for _, id := range s.Calls.Resolved {
			delete(c.outstanding, id)
		}
	}
	return c
}

// openChannel makes run id's channel directory, with the transcript
// restored from its sealed object when the run resumes.
func (d *Daemon) openChannel(id string, restored *resumed, lim unit.Limits) (*channel, error) {
	raw, err := d.st.Raw(id)
	if err != nil && restored != nil {
		return nil, err
	}
	c := callsOf(raw.Segments)
	ch := &channel{d: d, id: id, dir: filepath.Join(d.cfg.StateDir, "ch", id), lim: lim.Or(unit.DefaultLimits),
		interval: c.intervals + 1, seen: c.seen, outstanding: c.outstanding, dispatchAt: map[string]spoolRef{},
		spoolPath: filepath.Join(d.cfg.StateDir, "spool", id)}
	// The payloads of calls still outstanding from earlier intervals are
	// held for GET /v1/calls: they count against this interval's payload
	// limit, so what the daemon holds of a run's calls stays within it.
	if len(c.outstanding) > 0 {
		for callID, call := range d.recordedCalls(id, raw.Segments) {
			if c.outstanding[callID] {
				b, _ := json.Marshal(call)
				ch.payload += uint64(len(b))
			}
		}
	}
	if err := os.RemoveAll(ch.dir); err != nil {
		return nil, err
	}
	// STATE/ch is the daemon's alone (0700); the channel directory and
	// its socket are open to any user (0755, the socket 0666) so that a
	// unit whose root is mapped to an unprivileged host user still reads
	// its transcript and connects. The mount is read-only either way.
	if err := os.MkdirAll(ch.dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Dir(ch.dir), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(ch.dir, 0o755); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			ch.closeFiles()
			os.RemoveAll(ch.dir)
			os.Remove(ch.spoolPath)
		}
	}()
	// The directory is the daemon's, new, and not yet mounted anywhere:
	// the file is created, not found.
	ch.transcript, err = os.OpenFile(ch.transcriptPath(), os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, err
	}
	if fi, err := ch.transcript.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%v)", ErrTranscript, ch.transcriptPath(), err)
	}
	if restored != nil {
		if n, err := d.st.Size(restored.transcript); err == nil && uint64(n) > ch.lim.TranscriptBytes {
			return nil, fmt.Errorf("%w: the sealed transcript %s holds %d bytes, more than the run's limit of %d", ErrTranscript, restored.transcript, n, ch.lim.TranscriptBytes)
		}
		rd, err := d.st.Open(restored.transcript)
		if err == nil {
			ch.size, err = io.Copy(ch.transcript, rd)
			rd.Close()
		}
		if err != nil {
			return nil, fmt.Errorf("restoring the transcript %s: %w", restored.transcript, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(ch.spoolPath), 0o700); err != nil {
		return nil, err
	}
	if ch.spool, err = os.OpenFile(ch.spoolPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600); err != nil {
		return nil, err
	}
	sock := filepath.Join(ch.dir, protocol.SocketFile)
	if len(sock) >= 108 {
		return nil, fmt.Errorf("%w: channel socket path %s is too long for a unix socket: use a shorter state directory or run id", ErrInvalid, sock)
	}
	if ch.ln, err = net.Listen("unix", sock); err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		ch.ln.Close()
		return nil, err
	}
	ch.srv = protocol.NewServer(ch)
	ch.srv.SetLimits(int(ch.lim.ChannelConns), int64(min(ch.lim.ChannelInflightBytes, math.MaxInt64)))
	ok = true
	return ch, nil
}

func (c *channel) transcriptPath() string { return filepath.Join(c.dir, protocol.TranscriptFile) }

// serve serves the channel until it is closed.
func (c *channel) serve(d *Daemon, id string, lv *live) {
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		_ = c.srv.Serve(c.ln)
	}()
}

// stop stops serving, leaving the directory (and its transcript) for the
// next daemon to recover.
func (c *channel) stop() {
	c.srv.Close()
	c.ln.Close()
}

func (c *channel) close() {
	c.mu.Lock()
	done := c.closed
	c.closed = true
	c.mu.Unlock()
	if done {
		return // a resume may already have made the directory anew
	}
	c.srv.Close()
	c.ln.Close()
	c.mu.Lock() // a handler call in progress holds it to its end
	c.closeFiles()
	c.mu.Unlock()
	os.RemoveAll(c.dir)
	os.Remove(c.spoolPath)
}

func (c *channel) closeFiles() {
	if c.transcript != nil {
		c.transcript.Close()
		c.transcript = nil
	}
	if c.spool != nil {
		c.spool.Close()
		c.spool = nil
	}
}

// seal stores the transcript from the descriptor the daemon holds. The
// caller holds the gate.
func (c *channel) seal(ctx context.Context) (record.Snapshot, int64, error) {
	c.mu.Lock()
	f, size := c.transcript, c.size
	c.mu.Unlock()
	if f == nil {
		return record.Snapshot{}, 0, fmt.Errorf("park: transcript: %w", protocol.ErrParked)
	}
	a, err := c.d.st.Put(ctx, io.NewSectionReader(f, 0, size))
	if err != nil {
		return record.Snapshot{}, 0, fmt.Errorf("park: transcript: %w", err)
	}
	return record.TranscriptSnapshot(a), size, nil
}

// account is the interval's call account. An image-mode unit has no
// channel to dispatch through and no network beyond loopback, so its
// interval accounts for no calls.
func (lv *live) account() *record.CallAccount {
	if lv.spec.Mode == unit.TranscriptMode && lv.transcript == nil {
		return nil // its channel was another process's: not accounted
	}
	if lv.transcript == nil {
		return &record.CallAccount{}
	}
	c := lv.transcript
	c.mu.Lock()
	defer c.mu.Unlock()
	return &record.CallAccount{Dispatched: slices.Clone(c.dispatched), Resolved: slices.Clone(c.resolved)}
}

// spooled returns the interval's channel entries so far: how many, and
// their encoding, read from the spool.
func (c *channel) spooled() (int, io.Reader) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spool == nil {
		return 0, strings.NewReader("")
	}
	return c.spoolN, io.NewSectionReader(c.spool, 0, c.spoolSize)
}

// add spools one journal entry. The caller holds c.mu; on an error
// nothing was added.
func (c *channel) add(kind attest.EntryKind, data []byte) error {
	if c.spool == nil {
		return protocol.ErrParked
	}
	b := interval.AppendEntry(nil, kind, nowNS(), data)
	if _, err := c.spool.WriteAt(b, c.spoolSize); err != nil {
		return fmt.Errorf("spooling the journal: %w", err)
	}
	if kind == attest.Dispatch {
		var call protocol.Call
		if json.Unmarshal(data, &call) == nil {
			c.dispatchAt[call.ID] = spoolRef{off: c.spoolSize + int64(len(b)-len(data)), n: int64(len(data))}
		}
	}
	c.spoolSize += int64(len(b))
	c.spoolN++
	return nil
}

// dispatchedCall reads a call this interval dispatched back from the
// spool. The caller holds c.mu.
func (c *channel) dispatchedCall(id string) (protocol.Call, bool) {
	ref, ok := c.dispatchAt[id]
	if !ok || c.spool == nil {
		return protocol.Call{}, false
	}
	b := make([]byte, ref.n)
	if _, err := c.spool.ReadAt(b, ref.off); err != nil {
		return protocol.Call{}, false
	}
	var call protocol.Call
	if json.Unmarshal(b, &call) != nil {
		return protocol.Call{}, false
	}
	return call, true
}

// Hello implements protocol.Handler.
func (c *channel) Hello(ctx context.Context) (protocol.Hello, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return protocol.Hello{}, protocol.ErrParked
	}
	return protocol.Hello{Protocol: protocol.Version, Run: c.id, Interval: c.interval}, nil
}

// Append implements protocol.Handler: the daemon writes the transcript,
// through the descriptor it holds, within the run's transcript and
// payload limits.
func (c *channel) Append(ctx context.Context, data []byte) (int64, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.transcript == nil {
		return 0, protocol.ErrParked
	}
	n := uint64(len(data))
	if uint64(c.size)+n > c.lim.TranscriptBytes {
		return 0, fmt.Errorf("%w: the transcript holds %d bytes; %d more would pass the run's limit of %d", protocol.ErrTranscriptFull, c.size, n, c.lim.TranscriptBytes)
	}
	if c.payload+n > c.lim.IntervalPayloadBytes {
		return 0, fmt.Errorf("%w: this interval has appended and dispatched %d bytes; %d more would pass the run's limit of %d", protocol.ErrPayloadLimit, c.payload, n, c.lim.IntervalPayloadBytes)
	}
	if _, err := c.transcript.Write(data); err != nil {
		c.transcript.Truncate(c.size)
		return 0, err
	}
	if err := c.add(attest.Transcript, data); err != nil {
		c.transcript.Truncate(c.size)
		return 0, err
	}
	c.size += int64(n)
	c.payload += n
	return c.size, nil
}

// Dispatch implements protocol.Handler: the call is recorded in this
// interval's account and published to the platform.
func (c *channel) Dispatch(ctx context.Context, call protocol.Call) error {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return protocol.ErrParked
	}
	if c.seen[call.ID] {
		return fmt.Errorf("call %s: %w", call.ID, protocol.ErrDuplicateCall)
	}
	if max := min(int(c.lim.IntervalCalls), record.MaxCalls); len(c.dispatched) >= max {
		return fmt.Errorf("call %s: %w: an interval dispatches at most %d calls; await some first", call.ID, protocol.ErrTooManyCalls, max)
	}
	// Calls outstanding from earlier intervals count too: the daemon
	// keeps every outstanding call's payload for GET /v1/calls, so a run
	// that dispatches and never awaits must not pile them up interval
	// after interval.
	if max := int(c.lim.IntervalCalls); len(c.outstanding) >= max {
		return fmt.Errorf("call %s: %w: a run has at most %d calls outstanding at once; await some first", call.ID, protocol.ErrTooManyCalls, max)
	}
	b, _ := json.Marshal(call)
	if n := uint64(len(b)); c.payload+n > c.lim.IntervalPayloadBytes {
		return fmt.Errorf("call %s: %w: this interval has appended and dispatched %d bytes; this call's %d would pass the run's limit of %d", call.ID, protocol.ErrPayloadLimit, c.payload, n, c.lim.IntervalPayloadBytes)
	}
	if err := c.add(attest.Dispatch, b); err != nil {
		return err
	}
	c.payload += uint64(len(b))
	c.seen[call.ID], c.outstanding[call.ID] = true, true
	c.dispatched = append(c.dispatched, call.ID)
	c.d.publish(api.Event{Kind: "call.dispatched", Run: c.id, Call: call.ID, CallKind: call.Kind})
	return nil
}

// check reports why id cannot be awaited or read now.
func (c *channel) check(id string) error {
	if slices.Contains(c.resolved, id) {
		return nil
	}
	if !c.seen[id] {
		return fmt.Errorf("call %s: %w", id, protocol.ErrUnknownCall)
	}
	if !c.outstanding[id] {
		return fmt.Errorf("call %s: %w in an earlier interval", id, protocol.ErrResolved)
	}
	return nil
}

// resolve delivers id's posted result in this interval, if there is one.
func (c *channel) resolve(id string) (protocol.Result, bool, error) {
	for _, r := range c.delivered {
		if r.ID == id {
			return r, true, nil
		}
	}
	if len(c.resolved) >= record.MaxCalls {
		return protocol.Result{}, false, nil // the next interval takes the rest
	}
	p, ok := c.d.posted(c.id, id)
	if !ok {
		return protocol.Result{}, false, nil
	}
	r := protocol.Result{ID: id, Payload: p}
	b, _ := json.Marshal(r)
	if err := c.add(attest.Result, b); err != nil {
		return protocol.Result{}, false, err
	}
	delete(c.outstanding, id)
	c.resolved = append(c.resolved, id)
	c.delivered = append(c.delivered, r)
	return r, true, nil
}

// Await implements protocol.Handler. When every id already has a result
// the unit goes on; otherwise the interval ends and the run parks, and it
// resumes when the platform has posted the last of them.
func (c *channel) Await(ctx context.Context, ids []string) (bool, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, protocol.ErrParked
	}
	ready := true
	for _, id := range ids {
		if err := c.check(id); err != nil {
			return false, err
		}
		if _, ok := c.d.posted(c.id, id); !ok && !slices.Contains(c.resolved, id) {
			ready = false
		}
	}
	if ready {
		return false, nil
	}
	b, _ := json.Marshal(ids)
	if err := c.add(attest.Lifecycle, append([]byte("await "), b...)); err != nil {
		return false, err
	}
	c.awaiting = slices.Clone(ids)
	id := c.id
	c.d.bg.Add(1)
	go func() {
		defer c.d.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := c.d.parkAwaiting(ctx, id, c); err != nil {
			// The unit waits on; the platform sees why, and parks or
			// closes it by hand.
			c.d.log.Error("park on await", "run", id, "err", err)
			c.d.publish(api.Event{Kind: "run.park_failed", Run: id, Detail: err.Error()})
		}
	}()
	return true, nil
}

// Results implements protocol.Handler: every result for an outstanding
// call that the platform has posted, resolved in this interval.
func (c *channel) Results(ctx context.Context) ([]protocol.Result, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, protocol.ErrParked
	}
	ids := make([]string, 0, len(c.outstanding))
	for id := range c.outstanding {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if _, _, err := c.resolve(id); err != nil {
			return nil, err
		}
	}
	return slices.Clone(c.delivered), nil
}

// Result implements protocol.Handler: one call's result, if posted.
func (c *channel) Result(ctx context.Context, id string) (protocol.Result, bool, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return protocol.Result{}, false, protocol.ErrParked
	}
	if err := c.check(id); err != nil {
		return protocol.Result{}, false, err
	}
	return c.resolve(id)
}

// parkAwaiting parks run id for the await its channel ch received, unless
// the run has moved on (closed, or another sandbox) in the meantime.
func (d *Daemon) parkAwaiting(ctx context.Context, id string, ch *channel) (bool, error) {
	r, err := d.lockRun(id)
	if err != nil {
		return false, err
	}
	defer r.mu.Unlock()
	if r.live == nil || r.live.transcript != ch {
		return false, nil
	}
	if _, err := d.park(ctx, id, r); err != nil {
		return false, err
	}
	// A result posted between the await and the park found the run
	// executing and resumed nothing: resume now if every awaited result
	// is here.
	ch.mu.Lock()
	ids := slices.Clone(ch.awaiting)
	ch.mu.Unlock()
	for _, a := range ids {
		if _, ok := d.posted(id, a); !ok {
			return true, nil
		}
	}
	if _, err := d.resume(ctx, id, r); err != nil {
		d.log.Error("resume after park: every awaited result was posted before the park", "run", id, "err", err)
	}
	return true, nil
}

// resultsDir holds results posted for a run's calls on this host, one file
// per call, until the run closes.
func (d *Daemon) resultsDir(run string) string {
	return filepath.Join(d.cfg.StateDir, "results", run)
}

// resultName is the file a call's result is kept in: the SHA-256 of its
// id, so that any id the protocol takes (up to 256 bytes) names a file
// within NAME_MAX.
func resultName(call string) string {
	h := sha256.Sum256([]byte(call))
	return "sha256-" + hex.EncodeToString(h[:])
}

// legacyResultName is the name a daemon before resultName gave a result
// (base64 of the id), read still where it fits in a file name.
func legacyResultName(call string) (string, bool) {
	n := base64.RawURLEncoding.EncodeToString([]byte(call))
	return n, len(n) <= 255
}

// posted returns the result posted for a call, if any.
func (d *Daemon) posted(run, call string) ([]byte, bool) {
	b, err := os.ReadFile(filepath.Join(d.resultsDir(run), resultName(call)))
	if err == nil {
		return b, true
	}
	if n, ok := legacyResultName(call); ok {
		if b, err := os.ReadFile(filepath.Join(d.resultsDir(run), n)); err == nil {
			return b, true
		}
	}
	return nil, false
}

// awaited returns the ids the run's last interval awaited (its journal's
// await entry), or, without one, every outstanding call.
func (d *Daemon) awaited(segs []record.Segment, outstanding map[string]bool) []string {
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].Kind != record.Executed {
			continue
		}
		var last []byte
		err := d.scanJournal(segs[i].Attestation, []attest.EntryKind{attest.Lifecycle}, func(e attest.Entry) {
			if rest, ok := cutPrefix(e, "await "); ok {
				last = rest
			}
		})
		if err != nil || last == nil {
			break
		}
		var ids []string
		if json.Unmarshal(last, &ids) == nil {
			return ids
		}
		break
	}
	var ids []string
	for id := range outstanding {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func cutPrefix(e attest.Entry, p string) ([]byte, bool) {
	if e.Kind != attest.Lifecycle || len(e.Data) < len(p) || string(e.Data[:len(p)]) != p {
		return nil, false
	}
	return e.Data[len(p):], true
}

// PostResult takes the platform's result for one of run's outstanding
// calls. It refuses a call the run never dispatched, one already resolved
// and one that already has a result, so nothing accepted here can make an
// account malformed. When the run is parked and this was the last result
// its await named, the run resumes here.
func (d *Daemon) PostResult(ctx context.Context, run, call string, payload []byte) (api.PostResult, error) {
	if !json.Valid(payload) {
		return api.PostResult{}, fmt.Errorf("%w: the result payload is not JSON", ErrInvalid)
	}
	r, err := d.lockRun(run)
	if err != nil {
		return api.PostResult{}, err
	}
	defer r.mu.Unlock()
	st, err := d.st.Run(run)
	if err != nil {
		return api.PostResult{}, err
	}
	if st.Phase == record.Ended {
		return api.PostResult{}, fmt.Errorf("run %s: %w", run, record.ErrClosed)
	}
	if err := d.notHandedOff(run); err != nil {
		return api.PostResult{}, err
	}
	raw, err := d.st.Raw(run)
	if err != nil {
		return api.PostResult{}, err
	}
	c := callsOf(raw.Segments)
	if lv := r.live; lv != nil && lv.transcript != nil {
		ch := lv.transcript
		ch.mu.Lock()
		c.seen, c.outstanding = maps(ch.seen), maps(ch.outstanding)
		ch.mu.Unlock()
	}
	switch {
	case !c.seen[call]:
		return api.PostResult{}, fmt.Errorf("run %s: call %s: %w: the run never dispatched it", run, call, ErrCall)
	case !c.outstanding[call]:
		return api.PostResult{}, fmt.Errorf("run %s: call %s: %w: already resolved", run, call, ErrCall)
	}
	if _, ok := d.posted(run, call); ok {
		return api.PostResult{}, fmt.Errorf("run %s: call %s: %w: a result was already posted", run, call, ErrCall)
	}
	if err := os.MkdirAll(d.resultsDir(run), 0o700); err != nil {
		return api.PostResult{}, err
	}
	if err := writeDurable(filepath.Join(d.resultsDir(run), resultName(call)), payload); err != nil {
		return api.PostResult{}, err
	}
	d.publish(api.Event{Kind: "call.result", Run: run, Call: call})
	out := api.PostResult{Run: run, Call: call}
	if st.Phase != record.Parked || !st.Parked.IsTranscript() {
		return out, nil
	}
	for _, id := range d.awaited(raw.Segments, c.outstanding) {
		if _, ok := d.posted(run, id); !ok {
			out.Awaiting = append(out.Awaiting, id)
		}
	}
	if len(out.Awaiting) > 0 {
		return out, nil
	}
	res, err := d.resume(ctx, run, r)
	if err != nil {
		// The result is kept; the run stays parked and a later resume
		// (or a retry of the post's resume) delivers it.
		out.ResumeError = ErrorOf(err)
		return out, nil
	}
	out.Resumed = &res
	return out, nil
}

func maps(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// writeDurable writes b to path through a temporary file renamed over it,
// so a reader sees the old bytes or the new, never a part, and fsyncs the
// file before the rename and the directory after it — a result the API
// acknowledged survives a crash.
func writeDurable(path string, b []byte) error { return replace(path, b, true) }

func replace(path string, b []byte, durable bool) error {
	write := func(f *os.File) error {
		_, err := f.Write(b)
		return err
	}
	if durable {
		return atomicfile.Write(path, 0o600, write)
	}
	return atomicfile.WriteNoSync(path, 0o600, write)
}

// Calls lists the outward calls of every run that is not closed and has
// any outstanding: each with its payload (from the dispatching interval's
// journal) and whether a result has been posted.
func (d *Daemon) Calls(ctx context.Context) ([]api.Call, error) {
	ids, err := d.st.AllRuns()
	if err != nil {
		return nil, err
	}
	var out []api.Call
	for _, id := range ids {
		st, err := d.st.Run(id)
		if err != nil || st.Phase == record.Ended {
			d.forgetCalls(id)
			continue
		}
		// A run held elsewhere (handed off, or a copy) awaits its results
		// on the host that holds it: listing its calls here too would have
		// a platform carry out a side effect twice.
		if _, off, err := d.st.HandedOff(id); err != nil || off {
			d.forgetCalls(id)
			continue
		}
		raw, err := d.st.Raw(id)
		if err != nil {
			continue
		}
		c := callsOf(raw.Segments)
		payloads := d.recordedCalls(id, raw.Segments)
		d.mu.Lock()
		r := d.runs[id]
		d.mu.Unlock()
		if r != nil {
			r.mu.Lock()
			if lv := r.live; lv != nil && lv.transcript != nil {
				ch := lv.transcript
				ch.mu.Lock()
				c.outstanding = maps(ch.outstanding)
				for id := range ch.dispatchAt {
					if call, ok := ch.dispatchedCall(id); ok && c.outstanding[id] {
						payloads[id] = call
					}
				}
				ch.mu.Unlock()
			}
			r.mu.Unlock()
		}
		for callID := range c.outstanding {
			p := payloads[callID]
			_, posted := d.posted(id, callID)
			out = append(out, api.Call{Run: id, Phase: st.Phase.String(), ID: callID, Kind: p.Kind, Payload: p.Payload, ResultPosted: posted})
		}
	}
	slices.SortFunc(out, func(a, b api.Call) int {
		if a.Run != b.Run {
			return cmpStr(a.Run, b.Run)
		}
		return cmpStr(a.ID, b.ID)
	})
	return out, nil
}

// recordedCalls is what a run's record holds of its outstanding calls:
// each one's kind and payload, from the journal of the interval that
// dispatched it. It is kept per run and brought up to date by reading
// only the journals of segments appended since the last call, so that
// `GET /v1/calls` does not read every journal of every open run each
// time.
type recordedCalls struct {
	segs     int                      // segments read
	payloads map[string]protocol.Call // dispatched and not resolved by those segments
}

// recordedCalls returns run id's outstanding recorded calls, from its
// segments segs. The map is a copy.
func (d *Daemon) recordedCalls(id string, segs []record.Segment) map[string]protocol.Call {
	d.recordedMu.Lock()
	defer d.recordedMu.Unlock()
	rc := d.recorded[id]
	if rc == nil || rc.segs > len(segs) {
		rc = &recordedCalls{payloads: map[string]protocol.Call{}}
	}
	for _, s := range segs[rc.segs:] {
		if s.Kind != record.Executed || s.Calls == nil {
			continue
		}
		if len(s.Calls.Dispatched) > 0 {
			want := make(map[string]bool, len(s.Calls.Dispatched))
			for _, c := range s.Calls.Dispatched {
				want[c] = true
			}
			found := map[string]protocol.Call{}
			err := d.scanJournal(s.Attestation, []attest.EntryKind{attest.Dispatch}, func(e attest.Entry) {
				var call protocol.Call
				if json.Unmarshal(e.Data, &call) == nil && want[call.ID] {
					found[call.ID] = call
				}
			})
			if err == nil {
				for id, call := range found {
					rc.payloads[id] = call
				}
			}
		}
		for _, c := range s.Calls.Resolved {
			delete(rc.payloads, c)
		}
	}
	rc.segs = len(segs)
	if d.recorded == nil {
		d.recorded = map[string]*recordedCalls{}
	}
	d.recorded[id] = rc
	out := make(map[string]protocol.Call, len(rc.payloads))
	for k, v := range rc.payloads {
		out[k] = v
	}
	return out
}

// forgetCalls drops a closed run's cached calls.
func (d *Daemon) forgetCalls(id string) {
	d.recordedMu.Lock()
	delete(d.recorded, id)
	d.recordedMu.Unlock()
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// recoverTranscript parks a transcript unit whose channel died with the
// daemon that served it: the sandbox is frozen, the transcript found on
// disk is sealed, and the interval is recorded without an account (the
// account was the dead daemon's), so the record stays honest — its wait
// proof becomes Unproved — and the run resumes from its transcript.
func (d *Daemon) recoverTranscript(ctx context.Context, id string, lv *live) error {
	st, err := d.st.Run(id)
	if err != nil {
		return err
	}
	rel := filepath.Join("ch", id, protocol.TranscriptFile)
	path := filepath.Join(d.cfg.StateDir, rel)
	if status, _ := lv.sb.Status(ctx); status != "paused" {
		if err := lv.sb.Pause(ctx); err != nil {
			return err
		}
	}
	// Opened by path, as nothing holds it now: beneath the state
	// directory, no symlink followed, no FIFO waited on, a regular file
	// within the run's limit or nothing.
	limit := lv.grants.Limits.Or(unit.DefaultLimits).TranscriptBytes
	f, err := readTranscript(d.cfg.StateDir, rel, limit)
	if err != nil {
		if errors.Is(err, ErrTranscript) {
			os.RemoveAll(filepath.Dir(path))
		}
		return fmt.Errorf("run %s: recovering the transcript: %w", id, err)
	}
	a, err := d.st.Put(ctx, io.LimitReader(f, int64(min(limit, math.MaxInt64))))
	f.Close()
	if err != nil {
		return err
	}
	man, err := d.manifestOver(ctx, manifest.TranscriptKeys, lv.spec, st.Unit)
	if err != nil {
		return err
	}
	manAddr, err := d.putManifest(man)
	if err != nil {
		return err
	}
	outcome, susp, err := interval.Parked(record.TranscriptSnapshot(a), manAddr)
	if err != nil {
		return err
	}
	// No account (nil): the channel that kept it died with the daemon.
	// The channel's spool is not read either: lv.transcript is nil here.
	if _, err := d.end(ctx, lv, outcome, nil, []record.Segment{susp},
		attest.LifecycleOf(nowNS(), attest.Recovered{Reason: "the daemon serving the unit's channel stopped; the interval's call account was lost with it"})); err != nil {
		return err
	}
	lv.stopping = true
	d.destroy(lv)
	return os.RemoveAll(filepath.Dir(path))
}
