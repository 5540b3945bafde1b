package calls

import (
	"context"
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

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Daemon is what a channel tells the daemon that serves it.
type Daemon interface {
	// Dispatched announces a call the unit dispatched.
	Dispatched(run string, c protocol.Call)
	// Awaiting asks for run to be parked: the unit awaits results not
	// yet posted. It must not wait for the park, which needs the
	// channel's gate, held by the handler that calls it.
	Awaiting(run string, ch *Channel)
}

// Config is one interval's channel.
type Config struct {
	Run string
	// Dir is the channel directory, made anew here: its parent is the
	// daemon's own (made 0700), the directory and its socket are open to
	// any user (a unit whose root maps to an unprivileged host user
	// connects too); it is mounted read-only in the sandbox.
	Dir string
	// Spool is the file the interval's journal entries are spooled to,
	// in the daemon's own state directory.
	Spool string
	// Limits are the run's limits; a zero field takes the default.
	Limits unit.Limits
	// Restore is the transcript a resume restores; nil at a run's start.
	Restore *record.Address
}

// Channel is a transcript unit's directory on this host — its transcript
// and its socket — and the protocol.Handler behind the socket for one
// interval: it keeps the interval's call account and journal entries, and
// writes the unit's calls to the ledger.
//
// The daemon holds the transcript by the descriptor it created it with
// and never opens it by path again while it serves the channel; the
// interval's journal entries are spooled to a file in the daemon's own
// state directory, not held in memory.
type Channel struct {
	run  string
	dir  string
	st   Store
	host Daemon
	ln   net.Listener
	srv  *protocol.Server
	lim  unit.Limits // defaults filled in

	// gate is held by every handler call, and by a park while it seals
	// the transcript and records the interval: no append or dispatch can
	// slip in between, and if the park is refused the unit goes on.
	gate sync.Mutex

	mu          sync.Mutex
	interval    uint64 // the open interval: the ledger's recorded intervals + 1
	outstanding int    // the run's calls awaiting results, this interval's included
	dispatched  []string
	resolved    []string
	delivered   []protocol.Result // results resolved in this interval, in order
	closed      bool              // the interval is over: every call is refused

	transcript *os.File // opened once, O_APPEND; sealed from here
	size       int64    // the transcript's size
	payload    uint64   // append and dispatch bytes of this interval

	spool     *os.File // this interval's journal entries, encoded
	spoolPath string
	spoolN    int
	spoolSize int64
}

// Open makes run's channel directory for its next interval, with the
// transcript restored from its sealed object when the run resumes, and
// listens on its socket; [Channel.Serve] serves it.
func Open(cfg Config, st Store, host Daemon) (*Channel, error) {
	c := &Channel{run: cfg.Run, dir: cfg.Dir, st: st, host: host, lim: cfg.Limits.Or(unit.DefaultLimits), spoolPath: cfg.Spool}
	if err := c.fromLedger(cfg.Restore != nil); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Dir(c.dir), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(c.dir, 0o755); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.closeFiles()
			os.RemoveAll(c.dir)
			os.Remove(c.spoolPath)
		}
	}()
	if err := c.openTranscript(cfg.Restore); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(c.spoolPath), 0o700); err != nil {
		return nil, err
	}
	var err error
	if c.spool, err = os.OpenFile(c.spoolPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600); err != nil {
		return nil, err
	}
	sock := filepath.Join(c.dir, protocol.SocketFile)
	if len(sock) >= 108 {
		return nil, fmt.Errorf("%w: channel socket path %s is too long for a unix socket: use a shorter state directory or run id", ErrPath, sock)
	}
	if c.ln, err = net.Listen("unix", sock); err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		c.ln.Close()
		return nil, err
	}
	c.srv = protocol.NewServer(c)
	c.srv.SetLimits(int(c.lim.ChannelConns), int64(min(c.lim.ChannelInflightBytes, math.MaxInt64)))
	ok = true
	return c, nil
}

// ErrPath is a channel directory whose socket path is too long.
var ErrPath = errors.New("channel path too long")

// fromLedger reads the run's open interval and its calls awaiting results
// from the ledger. The call objects of calls still outstanding from
// earlier intervals count against this interval's payload limit, so what
// the daemon keeps of a run's calls stays within it. A run not stored yet
// (being started) has none; a resumed one must be stored.
func (c *Channel) fromLedger(resumed bool) error {
	l, err := c.st.Calls(c.run)
	if errors.Is(err, store.ErrNoRun) && !resumed {
		err = nil
	}
	if err != nil {
		return err
	}
	c.interval = l.Intervals + 1
	for _, call := range l.Calls {
		if call.State == store.CallResolved {
			continue
		}
		c.outstanding++
		n, err := c.st.Size(call.Payload)
		if call.Payload.IsZero() || err != nil {
			n = int64(len(`{"id":"","kind":"","payload":null}`) + len(call.ID) + len(call.Kind))
		}
		c.payload += uint64(n)
	}
	return nil
}

// openTranscript creates the transcript, restoring restore into it.
func (c *Channel) openTranscript(restore *record.Address) error {
	// The directory is the daemon's, new, and not yet mounted anywhere:
	// the file is created, not found.
	var err error
	c.transcript, err = os.OpenFile(c.transcriptPath(), os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	if fi, err := c.transcript.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file (%v)", ErrTranscript, c.transcriptPath(), err)
	}
	if restore == nil {
		return nil
	}
	if n, err := c.st.Size(*restore); err == nil && uint64(n) > c.lim.TranscriptBytes {
		return fmt.Errorf("%w: the sealed transcript %s holds %d bytes, more than the run's limit of %d", ErrTranscript, restore, n, c.lim.TranscriptBytes)
	}
	rd, err := c.st.Open(*restore)
	if err == nil {
		c.size, err = io.Copy(c.transcript, rd)
		rd.Close()
	}
	if err != nil {
		return fmt.Errorf("restoring the transcript %s: %w", restore, err)
	}
	return nil
}

// Reload reads the open interval and the calls awaiting results from the
// ledger again, as Open read them: a channel made ahead of its interval
// (a warm sandbox's, docs/warm-pool.md) takes the ledger as it stands
// when the interval begins. Nothing may have been handled on it yet.
func (c *Channel) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.dispatched)+len(c.resolved)+c.spoolN > 0 {
		return fmt.Errorf("reload %s: %w", c.run, protocol.ErrParked)
	}
	c.interval, c.outstanding, c.payload = 0, 0, 0
	return c.fromLedger(true)
}

func (c *Channel) transcriptPath() string { return filepath.Join(c.dir, protocol.TranscriptFile) }

// Dir is the channel directory, to mount in the sandbox.
func (c *Channel) Dir() string { return c.dir }

// Interval is the interval the channel serves, counting the run's
// executed intervals from 1.
func (c *Channel) Interval() int64 { return int64(c.interval) }

// Gate is held by every request the channel handles. A park holds it
// while it seals the transcript and records the interval, so nothing
// reaches the transcript or the account in between.
func (c *Channel) Gate() sync.Locker { return &c.gate }

// Serve serves the socket until the channel is stopped or closed.
func (c *Channel) Serve() error { return c.srv.Serve(c.ln) }

// Stop stops serving, leaving the directory (and its transcript) for the
// next daemon to recover.
func (c *Channel) Stop() {
	c.srv.Close()
	c.ln.Close()
}

// Close ends the channel: it stops serving and removes the directory and
// the spool. Closing a closed channel does nothing (a resume may already
// have made the directory anew).
func (c *Channel) Close() {
	c.mu.Lock()
	done := c.closed
	c.closed = true
	c.mu.Unlock()
	if done {
		return
	}
	c.srv.Close()
	c.ln.Close()
	c.mu.Lock() // a handler call in progress holds it to its end
	c.closeFiles()
	c.mu.Unlock()
	os.RemoveAll(c.dir)
	os.Remove(c.spoolPath)
}

func (c *Channel) closeFiles() {
	if c.transcript != nil {
		c.transcript.Close()
		c.transcript = nil
	}
	if c.spool != nil {
		c.spool.Close()
		c.spool = nil
	}
}

// Seal stores the transcript from the descriptor the channel holds, and
// returns its snapshot and size. The caller holds the gate.
func (c *Channel) Seal(ctx context.Context) (record.Snapshot, int64, error) {
	c.mu.Lock()
	f, size := c.transcript, c.size
	c.mu.Unlock()
	if f == nil {
		return record.Snapshot{}, 0, fmt.Errorf("park: transcript: %w", protocol.ErrParked)
	}
	a, err := c.st.Put(ctx, io.NewSectionReader(f, 0, size))
	if err != nil {
		return record.Snapshot{}, 0, fmt.Errorf("park: transcript: %w", err)
	}
	return record.TranscriptSnapshot(a), size, nil
}

// Account is the interval's call account so far: the calls dispatched in
// it and the results delivered to it, in order.
func (c *Channel) Account() *record.CallAccount {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &record.CallAccount{Dispatched: slices.Clone(c.dispatched), Resolved: slices.Clone(c.resolved)}
}

// Spooled returns the interval's channel entries so far: how many, and
// their encoding, read from the spool (internal/interval streams them
// into the journal).
func (c *Channel) Spooled() (int, io.Reader) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spool == nil {
		return 0, strings.NewReader("")
	}
	return c.spoolN, io.NewSectionReader(c.spool, 0, c.spoolSize)
}

// spoolMark is where the spool stood; rewind goes back to it.
type spoolMark struct {
	n    int
	size int64
}

// add spools one journal entry. The caller holds c.mu; on an error
// nothing was added.
func (c *Channel) add(kind attest.EntryKind, atNS int64, data []byte) error {
	if c.spool == nil {
		return protocol.ErrParked
	}
	b := attest.AppendEntry(nil, kind, atNS, data)
	if _, err := c.spool.WriteAt(b, c.spoolSize); err != nil {
		return fmt.Errorf("spooling the journal: %w", err)
	}
	c.spoolSize += int64(len(b))
	c.spoolN++
	return nil
}

func (c *Channel) mark() spoolMark { return spoolMark{c.spoolN, c.spoolSize} }

// rewind drops the entries spooled since m: what follows the spool's
// size is never read, and the next entry overwrites it.
func (c *Channel) rewind(m spoolMark) { c.spoolN, c.spoolSize = m.n, m.size }
