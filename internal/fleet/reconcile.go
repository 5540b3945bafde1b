package fleet

import "github.com/runrecordd/runrecordd/pkg/record"

// Action is what a starting host does about one run, comparing its store
// with the directory (docs/fleet.md, "Reconciling at start").
type Action int

// The actions of [Reconcile].
const (
	// Keep: nothing to do — a closed run, or an entry of a run this host
	// neither holds nor owns.
	Keep Action = iota
	// Reclaim: [Host.Claim] at the store's head. It re-owns a run this key
	// owned (or that was transferred here) at that head, and takes back a
	// reservation whose append never happened (the entry's previous head
	// is the store's).
	Reclaim
	// Register: the directory has no entry: [Host.Claim] creates it at the
	// store's head (a host joining a fleet with runs of its own).
	Register
	// Elsewhere: another host owns the run, or this host transferred it:
	// hold it handed off, and destroy its sandbox without appending.
	Elsewhere
	// Leftover: an entry of this key, still at its genesis, for a run the
	// store does not hold — a crash between a new run's claim and its
	// creation: [Host.Claim], then [Host.Remove].
	Leftover
	// Diverged: the entry names this key at a head the store is not at,
	// nor just before: the order of the two writes rules it out, so
	// something else wrote one of them. Hold the run for the operator.
	Diverged
)

func (a Action) String() string {
	switch a {
	case Keep:
		return "keep"
	case Reclaim:
		return "reclaim"
	case Register:
		return "register"
	case Elsewhere:
		return "elsewhere"
	case Leftover:
		return "leftover"
	case Diverged:
		return "diverged"
	}
	return "action(?)"
}

// Local is a run as this host's store holds it.
type Local struct {
	Head  record.Address
	Phase record.Phase
}

// Reconcile says what host self does about one run at its start, from the
// run in its store (nil when it holds none) and the run's directory entry
// (nil when the directory has none). It reads nothing and writes nothing.
func Reconcile(self record.Address, local *Local, e *Entry) Action {
	switch {
	case local == nil && e == nil:
		return Keep
	case local == nil:
		if e.Owner != self || !e.To.IsZero() {
			return Keep
		}
		if e.Head == e.Genesis && e.Phase == record.PhaseExecuting && e.Prev.IsZero() {
			return Leftover
		}
		return Diverged // this key owns a run its store lost
	case local.Phase == record.PhaseClosed:
		return Keep
	case e == nil:
		return Register
	case e.To == self:
		if e.Head == local.Head {
			return Reclaim
		}
		return Diverged
	case e.Owner != self || !e.To.IsZero():
		return Elsewhere
	case e.Head == local.Head && e.Phase == local.Phase:
		return Reclaim
	case !e.Prev.IsZero() && e.Prev == local.Head && e.PrevPhase == local.Phase:
		return Reclaim
	}
	return Diverged
}
