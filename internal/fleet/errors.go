package fleet

import "errors"

// The errors of the directory. Every refusal wraps one of them, with the
// run's genesis or the host's key id in its text.
var (
	// ErrNotOwner: another host owns the run (its lease is alive, and the
	// run was not transferred to this host), or this host does not own it
	// and so may not advance, revert or transfer it. An error of a host
	// whose lease is gone wraps both ErrNotOwner and ErrLeaseLost.
	ErrNotOwner = errors.New("run owned by another host")
	// ErrHeadMoved: the directory's head for the run is not the one the
	// caller named. Nothing was written.
	ErrHeadMoved = errors.New("directory head moved")
	// ErrUnavailable: etcd did not confirm the operation in time (no
	// quorum, unreachable, deadline passed). A write that returns it may
	// or may not have been applied; the caller must not act as if it
	// had been (safety over liveness), and reconciles as docs/fleet.md
	// says.
	ErrUnavailable = errors.New("etcd unavailable")
	// ErrLeaseLost: this host's lease expired or was revoked, or could not
	// be confirmed before it would have expired. The host owns nothing
	// from then on: it must stop its runs and join again.
	ErrLeaseLost = errors.New("host lease lost")
	// ErrHostActive: another session of this host key holds a live lease
	// (a daemon with the same key is running, or the last one died less
	// than a lease TTL ago). Join again once it has expired.
	ErrHostActive = errors.New("host key already joined")
	// ErrNotAdmitted: the key is not admitted to the fleet, or not with
	// the role the operation needs.
	ErrNotAdmitted = errors.New("key not admitted")
	// ErrNoRun: the directory has no entry for the run.
	ErrNoRun = errors.New("run not in the directory")
	// ErrNotParked: only a parked run is transferred.
	ErrNotParked = errors.New("run not parked")
	// ErrEntry: a value under the fleet's prefix does not decode as the
	// layout in docs/fleet.md says (written by something else, or by a
	// newer version).
	ErrEntry = errors.New("malformed directory value")
)
