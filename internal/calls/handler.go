package calls

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The protocol.Handler. Each request holds the gate and the channel's
// lock from start to end; a refused one changes nothing.

func nowNS() int64 { return time.Now().UnixNano() }

// Hello implements protocol.Handler.
func (c *Channel) Hello(ctx context.Context) (protocol.Hello, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return protocol.Hello{}, protocol.ErrParked
	}
	return protocol.Hello{Protocol: protocol.Version, Run: c.run, Interval: int64(c.interval)}, nil
}

// Append implements protocol.Handler: the daemon writes the transcript,
// through the descriptor it holds, within the run's transcript and
// payload limits.
func (c *Channel) Append(ctx context.Context, data []byte) (int64, error) {
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
	if err := c.add(attest.Transcript, nowNS(), data); err != nil {
		c.transcript.Truncate(c.size)
		return 0, err
	}
	c.size += int64(n)
	c.payload += n
	return c.size, nil
}

// Dispatch implements protocol.Handler: the call's JSON is stored as an
// object, journaled, and written to the ledger in this interval, then
// announced to the platform. It is in the interval's account from then.
func (c *Channel) Dispatch(ctx context.Context, call protocol.Call) error {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return protocol.ErrParked
	}
	if _, ok, err := c.st.Call(c.run, call.ID); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("call %s: %w", call.ID, protocol.ErrDuplicateCall)
	}
	if max := min(int(c.lim.IntervalCalls), record.MaxCalls); len(c.dispatched) >= max {
		return fmt.Errorf("call %s: %w: an interval dispatches at most %d calls; await some first", call.ID, protocol.ErrTooManyCalls, max)
	}
	// Calls outstanding from earlier intervals count too: the ledger
	// keeps every outstanding call's object for GET /v1/calls, so a run
	// that dispatches and never awaits must not pile them up interval
	// after interval.
	if max := int(c.lim.IntervalCalls); c.outstanding >= max {
		return fmt.Errorf("call %s: %w: a run has at most %d calls outstanding at once; await some first", call.ID, protocol.ErrTooManyCalls, max)
	}
	b, _ := json.Marshal(call)
	if n := uint64(len(b)); c.payload+n > c.lim.IntervalPayloadBytes {
		return fmt.Errorf("call %s: %w: this interval has appended and dispatched %d bytes; this call's %d would pass the run's limit of %d", call.ID, protocol.ErrPayloadLimit, c.payload, n, c.lim.IntervalPayloadBytes)
	}
	obj, err := c.st.PutBytes(b)
	if err != nil {
		return err
	}
	m := c.mark()
	if err := c.add(attest.Dispatch, nowNS(), b); err != nil {
		return err
	}
	if err := c.st.Dispatched(c.run, c.interval, store.Dispatch{ID: call.ID, Kind: call.Kind, Payload: obj}); err != nil {
		c.rewind(m)
		if errors.Is(err, store.ErrCallExists) {
			return fmt.Errorf("call %s: %w", call.ID, protocol.ErrDuplicateCall)
		}
		return err
	}
	c.payload += uint64(len(b))
	c.outstanding++
	c.dispatched = append(c.dispatched, call.ID)
	c.host.Dispatched(c.run, call)
	return nil
}

// deliveredResult returns the result delivered to this interval for id.
func (c *Channel) deliveredResult(id string) (protocol.Result, bool) {
	for _, r := range c.delivered {
		if r.ID == id {
			return r, true
		}
	}
	return protocol.Result{}, false
}

// check reports why id cannot be awaited or read now, and returns its
// ledger entry.
func (c *Channel) check(id string) (store.Call, error) {
	call, ok, err := c.st.Call(c.run, id)
	switch {
	case err != nil:
		return call, err
	case !ok:
		return call, fmt.Errorf("call %s: %w", id, protocol.ErrUnknownCall)
	case call.State == store.CallResolved && call.ResolvedIn != c.interval:
		return call, fmt.Errorf("call %s: %w in an earlier interval", id, protocol.ErrResolved)
	}
	return call, nil
}

// deliver delivers the posted results of calls, in order, to this
// interval: journaled, then resolved in the ledger. Calls past what one
// account records are left for the next interval. The caller holds c.mu.
func (c *Channel) deliver(calls []store.Call) error {
	m := c.mark()
	var rs []protocol.Result
	var ids []string
	for _, call := range calls {
		if len(c.resolved)+len(ids) >= record.MaxCalls {
			break // the next interval takes the rest
		}
		p, err := c.st.ReadAll(call.Result)
		if err != nil {
			c.rewind(m)
			return fmt.Errorf("call %s: its result: %w", call.ID, err)
		}
		r := protocol.Result{ID: call.ID, Payload: p}
		b, _ := json.Marshal(r)
		if err := c.add(attest.Result, nowNS(), b); err != nil {
			c.rewind(m)
			return err
		}
		rs, ids = append(rs, r), append(ids, call.ID)
	}
	if len(ids) == 0 {
		return nil
	}
	if err := c.st.Resolve(c.run, c.interval, ids...); err != nil {
		c.rewind(m)
		return err
	}
	c.outstanding -= len(ids)
	c.resolved = append(c.resolved, ids...)
	c.delivered = append(c.delivered, rs...)
	return nil
}

// Await implements protocol.Handler. When every id already has a result
// the unit goes on; otherwise the await is journaled and written to the
// ledger, and the host parks the run, which resumes when the platform has
// posted the last of them.
func (c *Channel) Await(ctx context.Context, ids []string) (bool, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, protocol.ErrParked
	}
	ready := true
	for _, id := range ids {
		call, err := c.check(id)
		if err != nil {
			return false, err
		}
		ready = ready && call.State != store.CallOutstanding
	}
	if ready {
		return false, nil
	}
	b, _ := json.Marshal(ids)
	m := c.mark()
	if err := c.add(attest.Lifecycle, nowNS(), append([]byte("await "), b...)); err != nil {
		return false, err
	}
	if err := c.st.Await(c.run, c.interval, ids); err != nil {
		c.rewind(m)
		return false, err
	}
	c.host.Awaiting(c.run, c)
	return true, nil
}

// Results implements protocol.Handler: every result the platform has
// posted for the run's calls, delivered to this interval, with those
// delivered before in it.
func (c *Channel) Results(ctx context.Context) ([]protocol.Result, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, protocol.ErrParked
	}
	l, err := c.st.Calls(c.run)
	if err != nil {
		return nil, err
	}
	posted := slices.DeleteFunc(l.Calls, func(call store.Call) bool { return call.State != store.CallPosted })
	if err := c.deliver(posted); err != nil {
		return nil, err
	}
	return slices.Clone(c.delivered), nil
}

// Result implements protocol.Handler: one call's result, if posted.
func (c *Channel) Result(ctx context.Context, id string) (protocol.Result, bool, error) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return protocol.Result{}, false, protocol.ErrParked
	}
	call, err := c.check(id)
	if err != nil {
		return protocol.Result{}, false, err
	}
	if r, ok := c.deliveredResult(id); ok {
		return r, true, nil
	}
	if call.State != store.CallPosted {
		return protocol.Result{}, false, nil
	}
	if err := c.deliver([]store.Call{call}); err != nil {
		return protocol.Result{}, false, err
	}
	r, ok := c.deliveredResult(id)
	return r, ok, nil
}
