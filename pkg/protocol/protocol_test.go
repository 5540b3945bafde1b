package protocol_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestLimitsMatchRecord(t *testing.T) {
	if protocol.MaxIDLen != record.MaxCallIDLen || protocol.MaxIDs != record.MaxCalls {
		t.Fatalf("protocol limits %d/%d, record limits %d/%d", protocol.MaxIDLen, protocol.MaxIDs, record.MaxCallIDLen, record.MaxCalls)
	}
}

func TestCodes(t *testing.T) {
	sentinels := map[error]string{
		protocol.ErrBadRequest:     "bad_request",
		protocol.ErrUnknownOp:      "unknown_op",
		protocol.ErrLineTooLong:    "line_too_long",
		protocol.ErrUnsupported:    "unsupported_protocol",
		protocol.ErrInvalidCall:    "invalid_call",
		protocol.ErrDuplicateCall:  "duplicate_call",
		protocol.ErrUnknownCall:    "unknown_call",
		protocol.ErrResolved:       "resolved",
		protocol.ErrTooManyCalls:   "too_many_calls",
		protocol.ErrParked:         "parked",
		protocol.ErrInternal:       "internal",
		protocol.ErrTooManyConns:   "too_many_connections",
		protocol.ErrInFlight:       "in_flight_limit",
		protocol.ErrTranscriptFull: "transcript_full",
		protocol.ErrPayloadLimit:   "payload_limit",
	}
	for err, code := range sentinels {
		wrapped := fmt.Errorf("call c1: %w", err)
		if got := protocol.Code(wrapped); got != code {
			t.Errorf("Code(%v) = %q, want %q", wrapped, got, code)
		}
		pe := &protocol.Error{Code: code, Message: "x"}
		for other := range sentinels {
			if errors.Is(pe, other) != (other == err) {
				t.Errorf("errors.Is(Error{%s}, %v) = %v", code, other, !(other == err))
			}
		}
	}
	if got := protocol.Code(errors.New("disk on fire")); got != "internal" {
		t.Errorf("Code(other) = %q", got)
	}
	if got := protocol.Code(nil); got != "" {
		t.Errorf("Code(nil) = %q", got)
	}
}

func TestOps(t *testing.T) {
	ctx := context.Background()
	d, sock, _ := mustDaemon(t)
	c := mustDial(t, sock)

	h, err := c.Hello(ctx)
	if err != nil || h != (protocol.Hello{Protocol: protocol.Version, Run: "run-1", Interval: 1}) {
		t.Fatalf("Hello = %+v, %v", h, err)
	}

	text, binary := []byte("step 1: thinking\n"), []byte{0xff, 0x00, '\n'}
	if size, err := c.Append(ctx, text); err != nil || size != int64(len(text)) {
		t.Fatalf("Append(text) = %d, %v", size, err)
	}
	if size, err := c.Append(ctx, binary); err != nil || size != int64(len(text)+len(binary)) {
		t.Fatalf("Append(binary) = %d, %v", size, err)
	}
	if got, _ := os.ReadFile(d.transcript); string(got) != string(text)+string(binary) {
		t.Fatalf("transcript = %q", got)
	}

	call := protocol.Call{ID: "c1", Kind: "build", Payload: json.RawMessage(`{ "target" : "all" }`)}
	if err := c.Dispatch(ctx, call); err != nil {
		t.Fatal(err)
	}
	if got := d.dispatched["c1"]; got.Kind != "build" || string(got.Payload) != `{"target":"all"}` {
		t.Fatalf("handler got %+v (payload %s)", got, got.Payload)
	}
	err = c.Dispatch(ctx, call)
	if !errors.Is(err, protocol.ErrDuplicateCall) {
		t.Fatalf("second Dispatch = %v, want ErrDuplicateCall", err)
	}
	if err := c.Dispatch(ctx, protocol.Call{ID: "c2", Kind: "review"}); err != nil {
		t.Fatal(err)
	}
	if got := d.dispatched["c2"].Payload; string(got) != "null" {
		t.Fatalf("absent payload reached the handler as %q", got)
	}

	if _, ok, err := c.Result(ctx, "c1"); ok || err != nil {
		t.Fatalf("Result before post = %v, %v", ok, err)
	}
	if _, _, err := c.Result(ctx, "nope"); !errors.Is(err, protocol.ErrUnknownCall) {
		t.Fatalf("Result(unknown) = %v", err)
	}
	if err := d.post("c1", `{"ok":1}`); err != nil {
		t.Fatal(err)
	}
	r, ok, err := c.Result(ctx, "c1")
	if err != nil || !ok || r.ID != "c1" || string(r.Payload) != `{"ok":1}` {
		t.Fatalf("Result after post = %+v, %v, %v", r, ok, err)
	}
	rs, err := c.Results(ctx)
	if err != nil || len(rs) != 1 || rs[0].ID != "c1" {
		t.Fatalf("Results = %+v, %v", rs, err)
	}
	if parking, err := c.Await(ctx, "c1"); err != nil || parking {
		t.Fatalf("Await(delivered) = %v, %v", parking, err)
	}
	if _, err := c.Await(ctx, "c1", "zz"); !errors.Is(err, protocol.ErrUnknownCall) {
		t.Fatalf("Await(unknown) = %v", err)
	}

	other := mustDial(t, sock) // a second connection, to see the park from
	parking, err := c.Await(ctx, "c1", "c2")
	if err != nil || !parking {
		t.Fatalf("Await(pending) = %v, %v", parking, err)
	}
	if got := <-d.parks; strings.Join(got, ",") != "c1,c2" {
		t.Fatalf("parked awaiting %v", got)
	}
	if _, err := c.Results(ctx); !errors.Is(err, protocol.ErrParked) {
		t.Fatalf("client after park: %v", err)
	}
	if err := other.Dispatch(ctx, protocol.Call{ID: "c3", Kind: "build"}); !errors.Is(err, protocol.ErrParked) {
		t.Fatalf("other connection after park: %v", err)
	}
	if _, ok := d.dispatched["c3"]; ok {
		t.Fatal("a dispatch after the park reached the handler")
	}
	want := record.CallAccount{Dispatched: []string{"c1", "c2"}, Resolved: []string{"c1"}}
	if got := d.cur; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("account %v, want %v", got, want)
	}
}

// TestWire pins request and response lines byte for byte.
func TestWire(t *testing.T) {
	d, sock, _ := mustDaemon(t)
	conn, r := rawDial(t, sock)
	for _, tc := range []struct{ req, resp string }{
		{`{"op":"hello"}`, `{"ok":true,"protocol":"runrecordd.unit/1","run":"run-1","interval":1}`},
		{`{"op":"hello","protocol":"runrecordd.unit/1"}`, `{"ok":true,"protocol":"runrecordd.unit/1","run":"run-1","interval":1}`},
		{`{"op":"append","data":""}`, `{"ok":true,"size":0}`},
		{`{"op":"append","data":"hi\n"}`, `{"ok":true,"size":3}`},
		{`{"op":"append","data":"/wA=","encoding":"base64"}`, `{"ok":true,"size":5}`},
		{`{"op":"results"}`, `{"ok":true,"results":[]}`},
		{`{"op":"dispatch","id":"c1","kind":"build","payload":{"n": [1, 2]}}`, `{"ok":true}`},
		{`{"op":"dispatch","id":"c1","kind":"build"}`, `{"ok":false,"error":"call c1: call id already dispatched","code":"duplicate_call"}`},
		{`{"op":"result","id":"c1"}`, `{"ok":true,"ready":false}`},
		{`{"op":"result","id":"c9"}`, `{"ok":false,"error":"call c9: call never dispatched","code":"unknown_call"}`},
		{"post c1", ""},
		{`{"op":"result","id":"c1"}`, `{"ok":true,"ready":true,"result":{"id":"c1","payload":{"artifact":"a1"}}}`},
		{`{"op":"results"}`, `{"ok":true,"results":[{"id":"c1","payload":{"artifact":"a1"}}]}`},
		{`{"op":"await","ids":["c1"]}`, `{"ok":true,"parking":false}`},
		{`{"op":"hello","protocol":"runrecordd.unit/2"}`, `{"ok":false,"error":"unsupported protocol version: \"runrecordd.unit/2\" (this daemon speaks \"runrecordd.unit/1\")","code":"unsupported_protocol"}`},
		{`{"op":"sleep"}`, `{"ok":false,"error":"unknown op: \"sleep\"","code":"unknown_op"}`},
		{`{"op":"dispatch","id":"","kind":"build"}`, `{"ok":false,"error":"invalid call id or kind: empty id","code":"invalid_call"}`},
		{`{"op":"results","id":"c1"}`, `{"ok":false,"error":"bad request: op results takes no \"id\"","code":"bad_request"}`},
		{`{"op":"await","ids":["c1"]}`, `{"ok":true,"parking":false}`},
		{`{"op":"await","ids":["c2"]}`, `{"ok":false,"error":"call c2: call never dispatched","code":"unknown_call"}`},
	} {
		if tc.req == "post c1" {
			if err := d.post("c1", `{"artifact":"a1"}`); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got := rawDo(t, conn, r, tc.req); got != tc.resp {
			t.Errorf("%s\n got %s\nwant %s", tc.req, got, tc.resp)
		}
	}
	if got, _ := os.ReadFile(d.transcript); string(got) != "hi\n\xff\x00" {
		t.Errorf("transcript = %q", got)
	}
	if got := d.dispatched["c1"].Payload; string(got) != `{"n":[1,2]}` {
		t.Errorf("payload reached the handler as %s", got)
	}
}

// TestRefusals sends malformed lines and checks each code, and that the
// connection survives every one.
func TestRefusals(t *testing.T) {
	_, sock, _ := mustDaemon(t)
	conn, r := rawDial(t, sock)
	long := strings.Repeat("x", protocol.MaxIDLen+1)
	for _, tc := range []struct{ req, code string }{
		{`{"op":`, "bad_request"},
		{`not json`, "bad_request"},
		{``, "bad_request"},
		{`[]`, "bad_request"},
		{`{}`, "bad_request"},
		{`{"op":"hello"} {"op":"hello"}`, "bad_request"},
		{`{"op":"hello","extra":1}`, "bad_request"},
		{`{"op":"HELLO"}`, "unknown_op"},
		{`{"op":"append","data":"!!","encoding":"base64"}`, "bad_request"},
		{`{"op":"append","data":"x","encoding":"hex"}`, "bad_request"},
		{`{"op":"append","id":"c1"}`, "bad_request"},
		{`{"op":"dispatch","id":"c1"}`, "invalid_call"},
		{`{"op":"dispatch","kind":"build"}`, "invalid_call"},
		{`{"op":"dispatch","id":"` + long + `","kind":"build"}`, "invalid_call"},
		{`{"op":"dispatch","id":"c1","kind":"build","ids":["c1"]}`, "bad_request"},
		{`{"op":"await"}`, "bad_request"},
		{`{"op":"await","ids":[]}`, "bad_request"},
		{`{"op":"await","ids":["a","a"]}`, "bad_request"},
		{`{"op":"await","ids":[""]}`, "invalid_call"},
		{`{"op":"result"}`, "invalid_call"},
		{`{"op":"hello","protocol":"x"}`, "unsupported_protocol"},
	} {
		var resp protocol.Response
		if err := json.Unmarshal([]byte(rawDo(t, conn, r, tc.req)), &resp); err != nil {
			t.Fatal(err)
		}
		if resp.OK || resp.Code != tc.code || resp.Error == "" {
			t.Errorf("%.60s: got %+v, want code %s", tc.req, resp, tc.code)
		}
	}
	if got := rawDo(t, conn, r, `{"op":"append","data":"still here"}`); got != `{"ok":true,"size":10}` {
		t.Errorf("after refusals: %s", got)
	}
}

func TestOversizedLine(t *testing.T) {
	d, sock, _ := mustDaemon(t)
	conn, r := rawDial(t, sock)

	// A line of exactly DefaultMaxLine bytes is served.
	prefix, suffix := `{"op":"append","data":"`, `"}`
	fill := strings.Repeat("a", protocol.DefaultMaxLine-len(prefix)-len(suffix))
	want := fmt.Sprintf(`{"ok":true,"size":%d}`, len(fill))
	if got := rawDo(t, conn, r, prefix+fill+suffix); got != want {
		t.Fatalf("line of DefaultMaxLine bytes: %s", got)
	}
	// One byte more is refused, and nothing reaches the handler.
	got := rawDo(t, conn, r, prefix+fill+"a"+suffix)
	if want := `{"ok":false,"error":"request line too long: more than 1048576 bytes","code":"line_too_long"}`; got != want {
		t.Fatalf("oversized line: %s", got)
	}
	if fi, _ := os.Stat(d.transcript); fi.Size() != int64(len(fill)) {
		t.Fatalf("transcript is %d bytes", fi.Size())
	}
	// The connection stays in step.
	if got := rawDo(t, conn, r, `{"op":"results"}`); got != `{"ok":true,"results":[]}` {
		t.Fatalf("after oversized line: %s", got)
	}
}

func TestSmallMaxLine(t *testing.T) {
	dir := t.TempDir()
	d := newDaemon(mustTranscript(t, dir))
	sock := dir + "/sock"
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := protocol.NewServer(d)
	s.SetMaxLine(64)
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	c := mustDial(t, sock)
	if _, err := c.Append(context.Background(), []byte(strings.Repeat("b", 100))); !errors.Is(err, protocol.ErrLineTooLong) {
		t.Fatalf("Append(100 bytes) = %v", err)
	}
	if _, err := c.Hello(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Closing the listener by its owner ends Serve with nil.
	l.Close()
	if err := <-served; err != nil {
		t.Fatalf("Serve after listener close = %v", err)
	}
	s.Close()
}

func TestConcurrentClients(t *testing.T) {
	ctx := context.Background()
	d, sock, _ := mustDaemon(t)
	const clients, calls = 16, 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	sizes := map[int64]bool{}
	won := 0
	for i := range clients {
		wg.Go(func() {
			c := mustDial(t, sock)
			for j := range calls {
				if err := c.Dispatch(ctx, protocol.Call{ID: fmt.Sprintf("c%d-%d", i, j), Kind: "build"}); err != nil {
					t.Error(err)
					return
				}
				size, err := c.Append(ctx, []byte("0123456789"))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				sizes[size] = true
				mu.Unlock()
			}
			err := c.Dispatch(ctx, protocol.Call{ID: "shared", Kind: "build"})
			switch {
			case err == nil:
				mu.Lock()
				won++
				mu.Unlock()
			case !errors.Is(err, protocol.ErrDuplicateCall):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := len(d.dispatches()); n != clients*calls+1 {
		t.Errorf("%d dispatches, want %d", n, clients*calls+1)
	}
	if won != 1 {
		t.Errorf("%d clients dispatched the shared id", won)
	}
	if len(sizes) != clients*calls {
		t.Errorf("%d distinct sizes after %d appends", len(sizes), clients*calls)
	}
	if fi, _ := os.Stat(d.transcript); fi.Size() != 10*clients*calls {
		t.Errorf("transcript is %d bytes", fi.Size())
	}
}

func TestShutdown(t *testing.T) {
	dir := t.TempDir()
	d := newDaemon(mustTranscript(t, dir))
	l, err := net.Listen("unix", dir+"/sock")
	if err != nil {
		t.Fatal(err)
	}
	s := protocol.NewServer(d)
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	c := mustDial(t, dir+"/sock")
	if _, err := c.Hello(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	if err := <-served; !errors.Is(err, protocol.ErrServerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	if _, err := c.Hello(context.Background()); err == nil {
		t.Fatal("idle connection survived Shutdown")
	}
	if err := s.Serve(l); !errors.Is(err, protocol.ErrServerClosed) {
		t.Fatalf("Serve after Shutdown = %v", err)
	}
}

// TestClientContext: a daemon that never answers; the client gives up at
// ctx's deadline and stays unusable.
func TestClientContext(t *testing.T) {
	sock := t.TempDir() + "/sock"
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err == nil {
			defer conn.Close()
			bufio.NewReader(conn).ReadString('\n')
			time.Sleep(5 * time.Second)
		}
	}()
	c := mustDial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Hello(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Hello = %v", err)
	}
	if _, err := c.Results(context.Background()); err == nil {
		t.Fatal("client usable after a cancelled request")
	}

	// Cancellation, not only deadlines.
	c2 := protocol.NewClient(&stall{deadline: make(chan struct{})})
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel2)
	if _, err := c2.Hello(ctx2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Hello = %v", err)
	}
}

// stall is a net.Conn whose reads block until a deadline is set.
type stall struct {
	net.Conn
	once     sync.Once
	deadline chan struct{}
}

func (s *stall) Write(b []byte) (int, error) { return len(b), nil }
func (s *stall) Read([]byte) (int, error) {
	<-s.deadline
	return 0, os.ErrDeadlineExceeded
}
func (s *stall) SetDeadline(time.Time) error {
	s.once.Do(func() { close(s.deadline) })
	return nil
}
func (s *stall) Close() error { return nil }

func rawDial(t *testing.T, sock string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

func rawDo(t *testing.T, conn net.Conn, r *bufio.Reader, req string) string {
	t.Helper()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(req + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("%.60s: %v", req, err)
	}
	return strings.TrimSuffix(line, "\n")
}
