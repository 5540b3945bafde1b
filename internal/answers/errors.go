package answers

import "errors"

// The daemon's own refusals. Refusals from the rooms it joins pass through
// wrapped: pkg/record's phase errors, internal/store's, internal/resume's
// typed precondition errors, internal/executor's. internal/server maps
// each to its code.
var (
	// ErrInvalid is a request that cannot be carried out as given.
	ErrInvalid = errors.New("invalid request")
	// ErrNoSandbox is a run executing in its record with no sandbox on
	// this host (lost in a host restart, or imported while executing).
	ErrNoSandbox = errors.New("run has no sandbox on this host")
	// ErrStopping is a run started or resumed while the daemon parks its
	// runs to stop, or a follow of a run's output ended by the stop.
	ErrStopping = errors.New("the daemon is stopping")
)
