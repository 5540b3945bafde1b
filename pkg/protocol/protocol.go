package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Version names this protocol. A transcript park's environment manifest
// records it under the key "transcript.protocol"; a resume needs a daemon
// that speaks the same version.
const Version = "runrecordd.unit/1"

// The mounted directory and what it holds.
const (
	// Dir is where the daemon mounts the protocol directory inside a
	// transcript-mode sandbox, unless the unit's configuration says
	// otherwise.
	Dir = "/run/runrecordd"
	// TranscriptFile is the transcript's name in the directory.
	TranscriptFile = "transcript"
	// SocketFile is the socket's name in the directory.
	SocketFile = "sock"
)

// Limits. MaxIDLen and MaxIDs equal record.MaxCallIDLen and
// record.MaxCalls (a test holds them equal), so an id the protocol accepts
// is one a call account can carry.
const (
	DefaultMaxLine = 1 << 20 // bytes in one request line, newline excluded
	// DefaultMaxConns and DefaultMaxInFlight are a [Server]'s limits
	// until [Server.SetLimits] sets others: the connections open at
	// once, and the request bytes read and not yet answered across them.
	DefaultMaxConns    = 16
	DefaultMaxInFlight = 8 << 20
	MaxIDLen           = 256  // bytes in a call id or a kind
	MaxIDs             = 4096 // ids in one await
)

// Ops, the values of [Request].Op.
const (
	OpHello    = "hello"
	OpAppend   = "append"
	OpDispatch = "dispatch"
	OpAwait    = "await"
	OpResults  = "results"
	OpResult   = "result"
)

// Encodings of [Request].Data.
const (
	EncodingText   = ""       // the data is the string itself, UTF-8
	EncodingBase64 = "base64" // standard base64 with padding
)

// Errors. Each that crosses the socket has a stable code, given after it;
// docs/unit-protocol.md lists them. A [Handler] returns them (wrapped with
// %w and the call id if it likes) and the [Server] sends the code; the
// [Client] returns an [*Error] that matches the sentinel under [errors.Is].
// Any other handler error is sent as "internal" without its text.
var (
	ErrBadRequest     = errors.New("bad request")                          // bad_request
	ErrUnknownOp      = errors.New("unknown op")                           // unknown_op
	ErrLineTooLong    = errors.New("request line too long")                // line_too_long
	ErrUnsupported    = errors.New("unsupported protocol version")         // unsupported_protocol
	ErrInvalidCall    = errors.New("invalid call id or kind")              // invalid_call
	ErrDuplicateCall  = errors.New("call id already dispatched")           // duplicate_call
	ErrUnknownCall    = errors.New("call never dispatched")                // unknown_call
	ErrResolved       = errors.New("call resolved in an earlier interval") // resolved
	ErrTooManyCalls   = errors.New("too many calls in one interval")       // too_many_calls
	ErrParked         = errors.New("interval ended: the run is parking")   // parked
	ErrTooManyConns   = errors.New("too many connections on the channel")  // too_many_connections
	ErrInFlight       = errors.New("too many request bytes in flight")     // in_flight_limit
	ErrTranscriptFull = errors.New("transcript limit reached")             // transcript_full
	ErrPayloadLimit   = errors.New("interval payload limit reached")       // payload_limit
	ErrInternal       = errors.New("internal error")                       // internal

	// ErrServerClosed is returned by [Server.Serve] after [Server.Close]
	// or [Server.Shutdown]. It never crosses the socket.
	ErrServerClosed = errors.New("protocol: server closed")
)

// codes maps sentinels to wire codes. Order matters only for an error
// that wraps two sentinels: the first listed wins.
var codes = []struct {
	err  error
	code string
}{
	{ErrBadRequest, "bad_request"},
	{ErrUnknownOp, "unknown_op"},
	{ErrLineTooLong, "line_too_long"},
	{ErrUnsupported, "unsupported_protocol"},
	{ErrInvalidCall, "invalid_call"},
	{ErrDuplicateCall, "duplicate_call"},
	{ErrUnknownCall, "unknown_call"},
	{ErrResolved, "resolved"},
	{ErrTooManyCalls, "too_many_calls"},
	{ErrParked, "parked"},
	{ErrTooManyConns, "too_many_connections"},
	{ErrInFlight, "in_flight_limit"},
	{ErrTranscriptFull, "transcript_full"},
	{ErrPayloadLimit, "payload_limit"},
	{ErrInternal, "internal"},
}

// Code returns the wire code of err: the code of the first sentinel it
// wraps, "internal" for any other error, "" for nil.
func Code(err error) string {
	if err == nil {
		return ""
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "internal"
}

// Error is a refusal as a [Client] receives it: the code and the message
// the daemon sent. It matches the sentinel of its code under [errors.Is],
// so a unit writes errors.Is(err, protocol.ErrDuplicateCall).
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("protocol: %s (%s)", e.Message, e.Code)
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	for _, c := range codes {
		if c.code == e.Code {
			return c.err == target
		}
	}
	return false
}

// Call is an outward call a unit dispatches: an id unique in the run, a
// kind the platform routes on, and any JSON payload.
type Call struct {
	ID      string          `json:"id"`
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload"`
}

// Result is a call's result as the platform posted it.
type Result struct {
	ID      string          `json:"id"`
	Payload json.RawMessage `json:"payload"`
}

// Hello describes the interval a unit is running in. Interval counts a
// run's executed intervals from 1.
type Hello struct {
	Protocol string
	Run      string
	Interval int64
}

// Request is one request line. Only the fields of its Op may be set.
type Request struct {
	Op       string          `json:"op"`
	Protocol string          `json:"protocol,omitempty"` // hello, optional
	Data     string          `json:"data,omitempty"`     // append
	Encoding string          `json:"encoding,omitempty"` // append, optional
	ID       string          `json:"id,omitempty"`       // dispatch, result
	Kind     string          `json:"kind,omitempty"`     // dispatch
	Payload  json.RawMessage `json:"payload,omitempty"`  // dispatch, optional
	IDs      []string        `json:"ids,omitempty"`      // await
}

// stray returns the name of a field set that r's op does not take, or "".
func (r *Request) stray() string {
	set := []struct {
		name string
		set  bool
		ops  []string
	}{
		{"protocol", r.Protocol != "", []string{OpHello}},
		{"data", r.Data != "", []string{OpAppend}},
		{"encoding", r.Encoding != "", []string{OpAppend}},
		{"id", r.ID != "", []string{OpDispatch, OpResult}},
		{"kind", r.Kind != "", []string{OpDispatch}},
		{"payload", r.Payload != nil, []string{OpDispatch}},
		{"ids", r.IDs != nil, []string{OpAwait}},
	}
	for _, f := range set {
		if !f.set {
			continue
		}
		ok := false
		for _, op := range f.ops {
			ok = ok || op == r.Op
		}
		if !ok {
			return f.name
		}
	}
	return ""
}

// Response is one response line. OK is always present; Error and Code
// only when OK is false; the rest only for the op that returns them.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`

	Protocol string `json:"protocol,omitempty"` // hello
	Run      string `json:"run,omitempty"`      // hello
	Interval *int64 `json:"interval,omitempty"` // hello

	Size    *int64   `json:"size,omitempty"`    // append
	Parking *bool    `json:"parking,omitempty"` // await
	Results []Result `json:"results,omitzero"`  // results: [] when none
	Ready   *bool    `json:"ready,omitempty"`   // result
	Result  *Result  `json:"result,omitempty"`  // result, when ready
}

// checkID refuses an empty, oversized or non-UTF-8 id or kind.
func checkID(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalidCall, what)
	case len(s) > MaxIDLen:
		return fmt.Errorf("%w: %s of %d bytes (at most %d)", ErrInvalidCall, what, len(s), MaxIDLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not UTF-8", ErrInvalidCall, what)
	}
	return nil
}
