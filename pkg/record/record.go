package record

import (
	"fmt"
	"math/bits"
)

// Record is a run record held in memory: the unit and grant set it binds,
// its segments, and the head after each.
type Record struct {
	unit, grants Address
	genesis      Address
	// Segments and heads live in fixed-size chunks, so a growing record
	// never copies what it already holds.
	segs  [][]Segment
	heads [][]Address
	n     int
	chain *Chain
}

const chunkBits = 12
const chunkLen = 1 << chunkBits

func (r *Record) at(i int) *Segment { return &r.segs[i>>chunkBits][i&(chunkLen-1)] }

func (r *Record) headAt(i int) Address { return r.heads[i>>chunkBits][i&(chunkLen-1)] }

// New returns an empty record for a unit under a grant set.
func New(unit, grants Address) *Record {
	g := Genesis(unit, grants)
	return &Record{unit: unit, grants: grants, genesis: g, chain: NewChain(State{Head: g})}
}

// Unit returns the unit id the genesis head binds.
func (r *Record) Unit() Address { return r.unit }

// Grants returns the grant-set id the genesis head binds.
func (r *Record) Grants() Address { return r.grants }

// Genesis returns head₀.
func (r *Record) Genesis() Address { return r.genesis }

// Head returns the current head (genesis for an empty record).
func (r *Record) Head() Address { return r.chain.st.Head }

// Len returns the number of segments.
func (r *Record) Len() int { return r.n }

// State returns the chain state after the last segment.
func (r *Record) State() State { return r.chain.State() }

// Phase returns the phase after the last segment.
func (r *Record) Phase() Phase { return r.chain.st.Phase }

// Segment returns segment i. The caller must not modify it.
func (r *Record) Segment(i int) Segment {
	if i < 0 || i >= r.n {
		panic(fmt.Sprintf("record: segment %d of %d", i, r.n))
	}
	return *r.at(i)
}

// HeadAt returns the head after segment i.
func (r *Record) HeadAt(i int) Address {
	if i < 0 || i >= r.n {
		panic(fmt.Sprintf("record: head %d of %d", i, r.n))
	}
	return r.headAt(i)
}

// Append validates s against the record and appends it, returning the new
// head. A refused segment leaves the record exactly as it was; the error is
// a [*SegmentError] wrapping one of the package's sentinels.
func (r *Record) Append(s Segment) (Address, error) {
	h, err := r.chain.Append(&s)
	if err != nil {
		return Address{}, err
	}
	if s.Calls != nil {
		// Copy the id lists into one backing array; strings are immutable.
		d, res := s.Calls.Dispatched, s.Calls.Resolved
		ids := make([]string, 0, len(d)+len(res))
		ids = append(append(ids, d...), res...)
		s.Calls = &CallAccount{Dispatched: ids[:len(d):len(d)], Resolved: ids[len(d):]}
	}
	s.Snapshot = s.Snapshot.clone()
	if r.n&(chunkLen-1) == 0 {
		r.segs = append(r.segs, make([]Segment, 0, chunkLen))
		r.heads = append(r.heads, make([]Address, 0, chunkLen))
	}
	last := len(r.segs) - 1
	r.segs[last] = append(r.segs[last], s)
	r.heads[last] = append(r.heads[last], h)
	r.n++
	return h, nil
}

// Verify recomputes the record from genesis: every segment's phase rules
// and snapshot identity, and every head. A record built only by Append
// always verifies; one assembled from stored or received parts may not.
func (r *Record) Verify() error {
	if err := checkIDs(r.unit, r.grants); err != nil {
		return err
	}
	c := NewChain(Start(r.unit, r.grants))
	for i := range r.n {
		if err := c.verifyNext(i, r.at(i), r.headAt(i)); err != nil {
			return err
		}
	}
	return nil
}

// Verify recomputes a record from genesis over segs and checks each
// recomputed head against heads[i]. heads may be nil to check nothing but
// the phase rules; otherwise it must have one entry per segment. The error
// is a [*SegmentError] naming the first segment that fails.
func Verify(unit, grants Address, segs []Segment, heads []Address) error {
	if heads != nil && len(heads) != len(segs) {
		return fmt.Errorf("%w: %d heads for %d segments", ErrHeadMismatch, len(heads), len(segs))
	}
	if err := checkIDs(unit, grants); err != nil {
		return err
	}
	c := NewChain(Start(unit, grants))
	for i := range segs {
		if heads == nil {
			if _, err := c.Append(&segs[i]); err != nil {
				return err
			}
			continue
		}
		if err := c.verifyNext(i, &segs[i], heads[i]); err != nil {
			return err
		}
	}
	return nil
}

// checkIDs refuses a zero unit or grant-set id: the zero address names no
// object, so a record over it binds nothing.
func checkIDs(unit, grants Address) error {
	if unit.IsZero() || grants.IsZero() {
		return fmt.Errorf("%w: a zero unit or grant-set id names no object", ErrAddress)
	}
	return nil
}

// verifyNext appends segment i and checks the head it recomputes to.
func (c *Chain) verifyNext(i int, s *Segment, stated Address) error {
	h, err := c.Append(s)
	if err != nil {
		return err
	}
	if h != stated {
		return &SegmentError{Index: i, Err: fmt.Errorf("%w: stated %s, recomputed %s", ErrHeadMismatch, stated, h)}
	}
	return nil
}

// Totals is a run's energy: its receipts, its idle energy, and their sum.
type Totals struct {
	ActiveUJ uint64 // sum of the attested receipts
	IdleUJ   uint64 // sum of idle_uj over Resumed segments
	CostUJ   uint64 // ActiveUJ + IdleUJ
	// IdleMeasured is true when every Resumed segment's idle energy was
	// measured; a single estimate makes the idle total an estimate.
	IdleMeasured bool
}

// Totals sums the record's energy. receipt returns the microjoules of the
// receipt bound by an attestation address; this package does no I/O, so
// the caller resolves attestations. A missing receipt or an overflow is an
// error wrapping [ErrReceipt].
func (r *Record) Totals(receipt func(attestation Address) (uj uint64, ok bool)) (Totals, error) {
	t := Totals{IdleMeasured: true}
	var carry uint64
	for i := range r.n {
		s := r.at(i)
		switch s.Kind {
		case Executed:
			uj, ok := receipt(s.Attestation)
			if !ok {
				return Totals{}, &SegmentError{Index: i, Err: fmt.Errorf("%w: no receipt for attestation %s", ErrReceipt, s.Attestation)}
			}
			t.ActiveUJ, carry = bits.Add64(t.ActiveUJ, uj, 0)
		case Resumed:
			t.IdleUJ, carry = bits.Add64(t.IdleUJ, s.IdleUJ, 0)
			if s.Provenance != Measured {
				t.IdleMeasured = false
			}
		}
		if carry != 0 {
			return Totals{}, &SegmentError{Index: i, Err: fmt.Errorf("%w: energy total overflows", ErrReceipt)}
		}
	}
	t.CostUJ, carry = bits.Add64(t.ActiveUJ, t.IdleUJ, 0)
	if carry != 0 {
		return Totals{}, fmt.Errorf("%w: energy total overflows", ErrReceipt)
	}
	return t, nil
}
