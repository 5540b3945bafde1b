package record

import "fmt"

// VerdictKind is the outcome of a wait proof.
type VerdictKind uint8

// The four verdicts.
const (
	// Unproved: some interval did not account, or none did.
	Unproved VerdictKind = iota
	// NonBlocking: every interval accounts and resolves only calls that were
	// outstanding when it began.
	NonBlocking
	// Blocked: an interval resolved a call it dispatched itself.
	Blocked
	// Malformed: an account does not add up (a result for a call never
	// dispatched, a call resolved twice, an id dispatched twice).
	Malformed
)

func (k VerdictKind) String() string {
	switch k {
	case Unproved:
		return "Unproved"
	case NonBlocking:
		return "NonBlocking"
	case Blocked:
		return "Blocked"
	case Malformed:
		return "Malformed"
	}
	return fmt.Sprintf("verdict(%d)", uint8(k))
}

// Verdict is a wait proof's result. Segment is the 0-based index of the
// segment it concerns, for Blocked, Malformed, and Unproved caused by an
// unaccounted interval; it is -1 otherwise. Reason says why in words.
type Verdict struct {
	Kind    VerdictKind
	Segment int
	Reason  string
}

func (v Verdict) String() string {
	if v.Segment < 0 {
		return fmt.Sprintf("%s: %s", v.Kind, v.Reason)
	}
	return fmt.Sprintf("%s at segment %d: %s", v.Kind, v.Segment, v.Reason)
}

// WaitProof walks the record's segments in order holding the calls
// outstanding at each one's start; see [Proof].
func (r *Record) WaitProof() Verdict { return proof(r.n, r.at) }

// Proof walks segs in order holding the set of calls outstanding at each
// Executed segment's start. Within one segment, an id dispatched twice
// (there or earlier) or resolved twice, or a result for an id never
// dispatched, is Malformed; a result for an id the same segment dispatched
// is Blocked. Malformed outranks Blocked within a segment, and the first
// segment with either decides. An interval without an account ends the walk
// as Unproved: the calls it may have made are unknown, so nothing after it
// can be judged. A record with no accounted interval is Unproved.
func Proof(segs []Segment) Verdict {
	return proof(len(segs), func(i int) *Segment { return &segs[i] })
}

func proof(n int, at func(int) *Segment) Verdict {
	var w walk
	for i := range n {
		s := at(i)
		if s.Kind != Executed {
			continue
		}
		if s.Calls == nil {
			return Verdict{Kind: Unproved, Segment: i, Reason: "interval did not account for its calls"}
		}
		if v, ok := w.step(i, s.Calls); !ok {
			return v
		}
	}
	if !w.accounted {
		return Verdict{Kind: Unproved, Segment: -1, Reason: "no interval accounted for its calls"}
	}
	return Verdict{Kind: NonBlocking, Segment: -1, Reason: fmt.Sprintf("%d accounted intervals resolved only calls outstanding at their start", w.intervals)}
}

type walk struct {
	// state of each id seen: 1 outstanding, 2 resolved. Dispatched this
	// segment is tracked separately in step.
	calls     map[string]uint8
	mine      map[string]bool // dispatched by the current segment
	done      map[string]bool // resolved by the current segment
	accounted bool
	intervals int
}

const (
	callOutstanding = 1
	callResolved    = 2
)

func (w *walk) step(i int, acct *CallAccount) (Verdict, bool) {
	if w.calls == nil {
		w.calls = make(map[string]uint8)
		w.mine = make(map[string]bool)
		w.done = make(map[string]bool)
	}
	w.accounted = true
	w.intervals++
	malformed := func(format string, args ...any) (Verdict, bool) {
		return Verdict{Kind: Malformed, Segment: i, Reason: fmt.Sprintf(format, args...)}, false
	}
	// Judge the whole segment against the state at its start before
	// changing anything, so Malformed outranks Blocked regardless of order.
	mine, done := w.mine, w.done
	clear(mine)
	clear(done)
	for _, id := range acct.Dispatched {
		if _, seen := w.calls[id]; seen || mine[id] {
			return malformed("call %q dispatched twice", id)
		}
		mine[id] = true
	}
	var blocked string
	for _, id := range acct.Resolved {
		if done[id] || w.calls[id] == callResolved {
			return malformed("call %q resolved twice", id)
		}
		done[id] = true
		switch {
		case w.calls[id] == callOutstanding:
		case mine[id]:
			if blocked == "" {
				blocked = id
			}
		default:
			return malformed("result for call %q, never dispatched", id)
		}
	}
	if blocked != "" {
		return Verdict{Kind: Blocked, Segment: i, Reason: fmt.Sprintf("interval resolved call %q it dispatched itself", blocked)}, false
	}
	for id := range mine {
		w.calls[id] = callOutstanding
	}
	for id := range done {
		w.calls[id] = callResolved
	}
	return Verdict{}, true
}
