// Package protocol is the unit protocol of transcript-mode units
// ("runrecordd.unit/1"): the wire types, a [Client] a unit imports, and a
// [Server] the daemon runs over a [Handler]. docs/unit-protocol.md is the
// specification; this package is its reference implementation and depends
// on the standard library only, so a static unit can import it.
//
// # The mounted directory
//
// The daemon mounts a directory into each transcript-mode sandbox, at
// [Dir] unless configured otherwise, holding the transcript file
// ([TranscriptFile]) and a unix socket ([SocketFile]), read-only. The
// daemon owns writes to the transcript — a unit appends through the
// socket — and the unit may read the file directly. On resume the file is
// restored byte for byte from its sealed address.
//
// # Lines
//
// Each request is one JSON object on one line, answered by one response
// line: {"ok":true,...} or {"ok":false,"error":"...","code":"..."}. The
// codes are stable; each is the code of one sentinel ([ErrDuplicateCall]
// is "duplicate_call", and so on). [Code] maps an error to its code, and
// an [*Error] a client receives matches its sentinel under errors.Is.
//
// # Guarantees
//
// The [Server] validates every request before the [Handler] sees it and
// calls the Handler one call at a time. Once an await parks, no further
// request reaches the Handler: the interval's dispatched and resolved
// calls are fixed at the park. Request lines are capped ([DefaultMaxLine]);
// a longer one is refused with "line_too_long" and the connection stays
// usable. What a peer can make the Server hold is bounded
// ([Server.SetLimits]): connections open at once ([DefaultMaxConns]; one
// more is refused with "too_many_connections" and closed) and request
// bytes held across them ([DefaultMaxInFlight]; a line past it is
// refused with "in_flight_limit").
//
// The Server does not keep the call account; the daemon's Handler does,
// and refuses duplicate ids, results for unknown calls and results
// resolved in an earlier interval with the sentinels given here.
package protocol
