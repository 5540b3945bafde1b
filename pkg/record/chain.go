package record

import (
	"fmt"
	"math"

	"lukechampine.com/blake3"
)

// Domain is the genesis domain string.
const Domain = "sandbox.runrecord/1"

// Phase is where a run stands after its last segment.
type Phase uint8

// The three phases. A run starts PhaseExecuting.
const (
	PhaseExecuting Phase = iota
	PhaseParked
	PhaseClosed
)

func (p Phase) String() string {
	switch p {
	case PhaseExecuting:
		return "executing"
	case PhaseParked:
		return "parked"
	case PhaseClosed:
		return "closed"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// Genesis returns head₀ = BLAKE3("sandbox.runrecord/1" ‖ unit_id ‖ grants_id).
func Genesis(unit, grants Address) Address {
	var buf [len(Domain) + 64]byte
	n := copy(buf[:], Domain)
	n += copy(buf[n:], unit[:])
	copy(buf[n:], grants[:])
	return Address(blake3.Sum256(buf[:]))
}

// State is everything needed to judge and hash the next segment of a run:
// a store keeps it beside the segments so an append never rereads them.
type State struct {
	Head   Address  // head after the last segment (genesis when Len is 0)
	Len    int      // number of segments
	Phase  Phase    // phase after the last segment
	Last   Kind     // the last segment's kind; 0 when Len is 0
	IdleUJ uint64   // the sum of idle_uj over the Resumed segments
	Parked Snapshot // the snapshot suspended, while Phase is Parked
}

// Start returns the state of a run with no segments.
func Start(unit, grants Address) State {
	return State{Head: Genesis(unit, grants)}
}

// Chain advances a [State] one segment at a time. It owns a scratch buffer
// so advancing allocates nothing; a Chain is not safe for concurrent use.
type Chain struct {
	st  State
	buf []byte
}

// NewChain returns a chain continuing from st.
func NewChain(st State) *Chain { return &Chain{st: st, buf: make([]byte, 0, 256)} }

// State returns the chain's current state.
func (c *Chain) State() State { return c.st }

// Check reports whether s may be appended now, without appending it. The
// error is a [*SegmentError] naming the index s would take.
func (c *Chain) Check(s *Segment) error {
	if err := s.validate(); err != nil {
		return &SegmentError{Index: c.st.Len, Err: err}
	}
	if err := c.st.allows(s); err != nil {
		return &SegmentError{Index: c.st.Len, Err: err}
	}
	return nil
}

// Append checks s, then advances the chain and returns the new head. A
// refused segment leaves the chain exactly as it was.
func (c *Chain) Append(s *Segment) (Address, error) {
	if err := c.Check(s); err != nil {
		return Address{}, err
	}
	c.buf = append(c.buf[:0], c.st.Head[:]...)
	c.buf = s.appendCanonical(c.buf)
	c.st.Head = blake3.Sum256(c.buf)
	c.st.Len++
	c.st.Last = s.Kind
	switch s.Kind {
	case Suspended:
		c.st.Phase = PhaseParked
		c.st.Parked = s.Snapshot.clone()
	case Resumed:
		c.st.Phase = PhaseExecuting
		c.st.Parked = Snapshot{}
		c.st.IdleUJ += s.IdleUJ // allows refused an overflow
	case Closed:
		c.st.Phase = PhaseClosed
		c.st.Parked = Snapshot{}
	}
	return c.st.Head, nil
}

// allows applies the phase rules to a validated segment, in the order
// docs/record-format.md lists them: the first rule broken is the error.
func (st *State) allows(s *Segment) error {
	if st.Phase == PhaseClosed {
		return fmt.Errorf("%w: no %s segment after close", ErrClosed, s.Kind)
	}
	switch s.Kind {
	case Executed, Suspended:
		if st.Phase == PhaseParked {
			return fmt.Errorf("%w: %s segment while parked", ErrParked, s.Kind)
		}
		// A park ends an interval: the segment before a Suspended one is
		// the Executed segment of the interval it ends.
		if s.Kind == Suspended && st.Last != Executed {
			if st.Len == 0 {
				return fmt.Errorf("%w: suspended segment with no executed interval since genesis", ErrAlternation)
			}
			return fmt.Errorf("%w: suspended segment after a %s one; a park follows an executed interval", ErrAlternation, st.Last)
		}
	case Resumed:
		if st.Phase != PhaseParked {
			return fmt.Errorf("%w: resumed segment while %s", ErrNotParked, st.Phase)
		}
		if !s.Snapshot.Equal(st.Parked) {
			return fmt.Errorf("%w: offered %s, recorded %s", ErrSnapshotMismatch, s.Snapshot, st.Parked)
		}
		if s.IdleUJ > math.MaxUint64-st.IdleUJ {
			return fmt.Errorf("%w: %d µJ on top of %d µJ", ErrOverflow, s.IdleUJ, st.IdleUJ)
		}
	}
	return nil
}

func (s Snapshot) clone() Snapshot {
	// One allocation for all three addresses: clone is on the append path.
	var n int
	for _, a := range [3]*Address{s.Root, s.Memory, s.Transcript} {
		if a != nil {
			n++
		}
	}
	if n == 0 {
		return Snapshot{}
	}
	block := make([]Address, 0, n)
	cp := func(a *Address) *Address {
		if a == nil {
			return nil
		}
		block = append(block, *a)
		return &block[len(block)-1]
	}
	return Snapshot{Root: cp(s.Root), Memory: cp(s.Memory), Transcript: cp(s.Transcript)}
}
