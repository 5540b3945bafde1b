package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
