package protocol

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Handler is the daemon's side of one interval. The [Server] validates each
// request before calling it (ids and kinds non-empty, at most [MaxIDLen]
// bytes; await ids 1 to [MaxIDs], none repeated) and calls it from one
// goroutine at a time, so a Handler needs no lock of its own against the
// server, and the order of its calls is the order the interval made them.
// Errors wrapping a sentinel reach the unit with its code; others are sent
// as "internal", and the others' text is sent as it is, so it should name
// the call id it concerns ("call c1: %w"). A call that returns an error must leave the run as it
// was: no byte appended, no call recorded or delivered.
type Handler interface {
	// Hello returns the run and interval; the server sets Protocol.
	Hello(ctx context.Context) (Hello, error)
	// Append appends data to the transcript and returns its new size:
	// ErrTranscriptFull past the transcript's limit, ErrPayloadLimit past
	// the interval's payload limit.
	Append(ctx context.Context, data []byte) (size int64, err error)
	// Dispatch records an outward call: ErrDuplicateCall if its id was
	// ever dispatched in the run, ErrTooManyCalls past the account's
	// limit, ErrPayloadLimit past the interval's payload limit.
	Dispatch(ctx context.Context, c Call) error
	// Await ends the interval unless every id's result is already
	// delivered to it; parking reports which. After parking is true the
	// server refuses every further request with ErrParked.
	Await(ctx context.Context, ids []string) (parking bool, err error)
	// Results returns the results delivered to this interval.
	Results(ctx context.Context) ([]Result, error)
	// Result returns the call's result if the platform has posted it,
	// delivering it to this interval; ok is false while it has not.
	Result(ctx context.Context, id string) (r Result, ok bool, err error)
}

// Server serves the protocol on listeners (a unix socket, for the daemon)
// to a [Handler]. Several connections may be open at once; each is a
// sequence of request lines, each answered by one response line in order.
// A request line longer than MaxLine is discarded up to its newline and
// answered with ErrLineTooLong; the connection stays usable.
//
// After an await that parks, the server answers that await and closes its
// connection; every later request on any connection is answered with
// ErrParked, without calling the Handler, and its connection closed: the
// interval's calls are fixed when it parks.
type Server struct {
	handler     Handler
	maxLine     int
	maxConns    int
	maxInFlight int64

	hmu    sync.Mutex // serialises Handler calls; guards parked
	parked bool

	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]bool // value: busy (a request read and not yet answered)
	inFlight  int64          // request bytes held across conns, read and not yet answered
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// NewServer returns a server calling h, with lines capped at
// [DefaultMaxLine].
func NewServer(h Handler) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		handler:     h,
		maxLine:     DefaultMaxLine,
		maxConns:    DefaultMaxConns,
		maxInFlight: DefaultMaxInFlight,
		listeners:   map[net.Listener]struct{}{},
		conns:       map[*conn]bool{},
		ctx:         ctx,
		cancel:      cancel,
	}
}

// SetMaxLine caps request lines at n bytes, newline excluded. Call it
// before Serve.
func (s *Server) SetMaxLine(n int) { s.maxLine = n }

// SetLimits caps the connections open at once at conns and the request
// bytes held across them at inFlight; a request line is capped at
// min(its cap, inFlight). Call it before Serve.
func (s *Server) SetLimits(conns int, inFlight int64) {
	s.maxConns, s.maxInFlight = conns, inFlight
	if int64(s.maxLine) > inFlight {
		s.maxLine = int(inFlight)
	}
}

// take reserves n bytes of the in-flight budget, or reports false.
func (s *Server) take(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight+int64(n) > s.maxInFlight {
		return false
	}
	s.inFlight += int64(n)
	return true
}

// release gives n bytes back to the in-flight budget.
func (s *Server) release(n int) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.inFlight -= int64(n)
	s.mu.Unlock()
}

// Parked reports whether an await has parked the interval.
func (s *Server) Parked() bool {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	return s.parked
}

// Serve accepts connections on l and serves each in its own goroutine. It
// returns ErrServerClosed after Close or Shutdown, nil when l is closed by
// its owner, and any other accept error wrapped.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			switch {
			case closing:
				return ErrServerClosed
			case errors.Is(err, net.ErrClosed):
				return nil
			}
			return fmt.Errorf("protocol: accept: %w", err)
		}
		c := &conn{s: s, nc: nc}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			nc.Close()
			return ErrServerClosed
		}
		if len(s.conns) >= s.maxConns {
			s.mu.Unlock()
			refuseConn(nc, fmt.Errorf("%w: at most %d open at once", ErrTooManyConns, s.maxConns))
			continue
		}
		s.conns[c] = false
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// refuseConn sends a connection the server will not serve its refusal, as
// one response line, and closes it. A new connection's send buffer is
// empty, so the write does not wait on the peer; the deadline is a guard.
func refuseConn(nc net.Conn, err error) {
	b, _ := json.Marshal(refusal(err))
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = nc.Write(append(b, '\n'))
	nc.Close()
}

// Close stops the server at once: it closes the listeners and every
// connection and cancels the context of Handler calls in progress. It does
// not wait for them to return.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closing = true
	s.cancel()
	var err error
	for l := range s.listeners {
		if e := l.Close(); e != nil && !errors.Is(e, net.ErrClosed) && err == nil {
			err = e
		}
	}
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	return err
}

// Shutdown stops the server gracefully: it closes the listeners and idle
// connections, lets each request being handled be answered, and waits for
// every connection to end or ctx to be done; then, if ctx ended first, it
// closes what is left as Close does and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	var err error
	for l := range s.listeners {
		if e := l.Close(); e != nil && !errors.Is(e, net.ErrClosed) && err == nil {
			err = e
		}
	}
	for c, busy := range s.conns {
		if !busy {
			c.nc.Close()
		}
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.cancel()
		return err
	case <-ctx.Done():
		s.Close()
		return ctx.Err()
	}
}

// conn is one connection.
type conn struct {
	s  *Server
	nc net.Conn
}

func (c *conn) serve() {
	s := c.s
	defer func() {
		c.nc.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()

	r := bufio.NewReaderSize(c.nc, connBuffer)
	w := bufio.NewWriter(c.nc)
	for {
		if !c.step(ctx, r, w) {
			return
		}
	}
}

// connBuffer is a connection's read buffer.
const connBuffer = 16 << 10

// step reads one request and answers it; it reports whether the
// connection goes on. The request's bytes are held against the in-flight
// budget until it is handled.
func (c *conn) step(ctx context.Context, r *bufio.Reader, w *bufio.Writer) bool {
	s := c.s
	line, held, err := readLine(r, s.maxLine, s.take)
	release := func() { s.release(held); held = 0 }
	defer release()
	if err != nil && !errors.Is(err, ErrLineTooLong) && !errors.Is(err, ErrInFlight) {
		return false // EOF, a closed connection, or a line cut short by EOF
	}
	if !c.setBusy(true) {
		return false // shutting down: a request read now is not answered
	}
	var resp Response
	var hangUp bool
	switch {
	case errors.Is(err, ErrLineTooLong):
		resp = refusal(fmt.Errorf("%w: more than %d bytes", err, s.maxLine))
	case err != nil:
		resp = refusal(fmt.Errorf("%w: the channel holds at most %d bytes of unanswered requests across its connections", err, s.maxInFlight))
	default:
		resp, hangUp = s.handle(ctx, line)
	}
	// The line is done with: its bytes are free before its answer is
	// sent, so a peer that has its answer finds them free.
	release()
	b, err := json.Marshal(resp)
	if err != nil {
		b, _ = json.Marshal(refusal(ErrInternal))
	}
	w.Write(b)
	w.WriteByte('\n')
	if err := w.Flush(); err != nil || hangUp || !c.setBusy(false) {
		return false
	}
	return true
}

// setBusy marks the connection busy or idle; it reports false when the
// server is shutting down and the connection should end.
func (c *conn) setBusy(busy bool) bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.closing {
		return false
	}
	c.s.conns[c] = busy
	return true
}

// readLine reads one line of at most maxLen bytes, without its newline. A
// longer line is read to its newline and discarded, and readLine returns
// ErrLineTooLong. Before the line grows its buffer, take is asked for the
// bytes it grows by; when take refuses, the line is read to its newline
// and discarded, and readLine returns ErrInFlight. held is what take
// granted, for the caller to give back once the line is answered, whatever
// the error. A line cut short by EOF is io.ErrUnexpectedEOF.
func readLine(r *bufio.Reader, maxLen int, take func(int) bool) (line []byte, held int, err error) {
	for {
		frag, err := r.ReadSlice('\n')
		n := len(frag)
		if err == nil {
			n-- // the newline
		}
		var refuse error
		need := len(line) + n
		switch {
		case need > maxLen:
			refuse = ErrLineTooLong
		case need > cap(line):
			// Grown by doubling, never past maxLen: held is the
			// buffer's whole capacity.
			// When the budget cannot give that much, the line takes
			// exactly what it needs, or is refused.
			c := min(max(need, 2*cap(line), 512), maxLen)
			if !take(c - cap(line)) {
				if c = need; !take(c - cap(line)) {
					refuse = ErrInFlight
					break
				}
			}
			held += c - cap(line)
			line = append(make([]byte, 0, c), line...)
		}
		if refuse != nil {
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			if err != nil {
				return nil, held, unexpected(err)
			}
			return nil, held, refuse
		}
		line = append(line, frag[:n]...)
		switch {
		case err == nil:
			return line, held, nil
		case err != bufio.ErrBufferFull:
			if len(line) == 0 {
				return nil, held, err
			}
			return nil, held, unexpected(err)
		}
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// refusal is the response for err.
func refusal(err error) Response {
	code := Code(err)
	msg := err.Error()
	if code == "internal" {
		msg = ErrInternal.Error() // a host's error text stays on the host
	}
	return Response{OK: false, Error: msg, Code: code}
}

// handle decodes and answers one request. hangUp is true when the
// connection should close after the response: the await that parked.
func (s *Server) handle(ctx context.Context, line []byte) (resp Response, hangUp bool) {
	req, err := decodeRequest(line)
	if err != nil {
		return refusal(err), false
	}
	if req.Op == OpHello && req.Protocol != "" && req.Protocol != Version {
		return refusal(fmt.Errorf("%w: %q (this daemon speaks %q)", ErrUnsupported, req.Protocol, Version)), false
	}

	s.hmu.Lock()
	defer s.hmu.Unlock()
	if s.parked {
		return refusal(ErrParked), true
	}
	h := s.handler
	switch req.Op {
	case OpHello:
		hello, err := h.Hello(ctx)
		if err != nil {
			return refusal(err), false
		}
		return Response{OK: true, Protocol: Version, Run: hello.Run, Interval: &hello.Interval}, false
	case OpAppend:
		data := []byte(req.Data)
		if req.Encoding == EncodingBase64 {
			if data, err = base64.StdEncoding.DecodeString(req.Data); err != nil {
				return refusal(fmt.Errorf("%w: data: %v", ErrBadRequest, err)), false
			}
		}
		size, err := h.Append(ctx, data)
		if err != nil {
			return refusal(err), false
		}
		return Response{OK: true, Size: &size}, false
	case OpDispatch:
		if err := h.Dispatch(ctx, Call{ID: req.ID, Kind: req.Kind, Payload: req.Payload}); err != nil {
			return refusal(err), false
		}
		return Response{OK: true}, false
	case OpAwait:
		parking, err := h.Await(ctx, req.IDs)
		if err != nil {
			return refusal(err), false
		}
		s.parked = parking
		return Response{OK: true, Parking: &parking}, parking
	case OpResults:
		rs, err := h.Results(ctx)
		if err != nil {
			return refusal(err), false
		}
		if rs == nil {
			rs = []Result{}
		}
		for i := range rs {
			rs[i].Payload = orNull(rs[i].Payload)
		}
		return Response{OK: true, Results: rs}, false
	case OpResult:
		r, ok, err := h.Result(ctx, req.ID)
		if err != nil {
			return refusal(err), false
		}
		resp := Response{OK: true, Ready: &ok}
		if ok {
			r.Payload = orNull(r.Payload)
			resp.Result = &r
		}
		return resp, false
	}
	panic("unreachable: decodeRequest admits only known ops")
}

// decodeRequest parses and validates one request line.
func decodeRequest(line []byte) (Request, error) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, fmt.Errorf("%w: more than one JSON value on the line", ErrBadRequest)
	}
	switch req.Op {
	case OpHello, OpAppend, OpDispatch, OpAwait, OpResults, OpResult:
	case "":
		return req, fmt.Errorf("%w: no op", ErrBadRequest)
	default:
		return req, fmt.Errorf("%w: %q", ErrUnknownOp, req.Op)
	}
	if f := req.stray(); f != "" {
		return req, fmt.Errorf("%w: op %s takes no %q", ErrBadRequest, req.Op, f)
	}
	switch req.Op {
	case OpAppend:
		if req.Encoding != EncodingText && req.Encoding != EncodingBase64 {
			return req, fmt.Errorf("%w: encoding %q", ErrBadRequest, req.Encoding)
		}
	case OpDispatch:
		if err := checkID("id", req.ID); err != nil {
			return req, err
		}
		if err := checkID("kind", req.Kind); err != nil {
			return req, err
		}
		if len(req.Payload) > 0 {
			var b bytes.Buffer
			if err := json.Compact(&b, req.Payload); err != nil {
				return req, fmt.Errorf("%w: payload: %v", ErrBadRequest, err)
			}
			req.Payload = b.Bytes()
		}
		req.Payload = orNull(req.Payload)
	case OpResult:
		if err := checkID("id", req.ID); err != nil {
			return req, err
		}
	case OpAwait:
		if len(req.IDs) == 0 || len(req.IDs) > MaxIDs {
			return req, fmt.Errorf("%w: await names %d ids (1 to %d)", ErrBadRequest, len(req.IDs), MaxIDs)
		}
		seen := make(map[string]bool, len(req.IDs))
		for _, id := range req.IDs {
			if err := checkID("id", id); err != nil {
				return req, err
			}
			if seen[id] {
				return req, fmt.Errorf("%w: id %q named twice", ErrBadRequest, id)
			}
			seen[id] = true
		}
	}
	return req, nil
}

// orNull is p, or the JSON null for an absent payload.
func orNull(p json.RawMessage) json.RawMessage {
	if len(p) == 0 {
		return json.RawMessage("null")
	}
	return p
}
