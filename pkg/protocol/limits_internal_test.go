package protocol

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// echo is a Handler that answers every op and holds nothing.
type echo struct{}

func (echo) Hello(context.Context) (Hello, error)                 { return Hello{Run: "r", Interval: 1}, nil }
func (echo) Append(_ context.Context, b []byte) (int64, error)    { return int64(len(b)), nil }
func (echo) Dispatch(context.Context, Call) error                 { return nil }
func (echo) Await(context.Context, []string) (bool, error)        { return false, nil }
func (echo) Results(context.Context) ([]Result, error)            { return nil, nil }
func (echo) Result(context.Context, string) (Result, bool, error) { return Result{}, false, nil }

func serve(t *testing.T, s *Server) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return sock
}

func dialRaw(t *testing.T, sock string) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc, bufio.NewReader(nc)
}

func answer(t *testing.T, nc net.Conn, r *bufio.Reader, req string) Response {
	t.Helper()
	if req != "" {
		if _, err := io.WriteString(nc, req+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	line, err := r.ReadBytes('\n')
	if err != nil {
		t.Fatalf("reading the answer to %.40q: %v", req, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

// waitInFlight waits until the server holds at least n request bytes.
func waitInFlight(t *testing.T, s *Server, n int64) {
	t.Helper()
	for range 5000 {
		s.mu.Lock()
		got := s.inFlight
		s.mu.Unlock()
		if got >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the server never held %d bytes", n)
}

// TestConnLimit: one connection past the limit is sent a
// too_many_connections line and closed; when one closes, a new one is
// served.
func TestConnLimit(t *testing.T) {
	s := NewServer(echo{})
	s.SetLimits(2, 1<<20)
	sock := serve(t, s)
	a, ar := dialRaw(t, sock)
	b, br := dialRaw(t, sock)
	for _, c := range []struct {
		nc net.Conn
		r  *bufio.Reader
	}{{a, ar}, {b, br}} {
		if resp := answer(t, c.nc, c.r, `{"op":"hello"}`); !resp.OK {
			t.Fatalf("hello on a kept connection: %+v", resp)
		}
	}
	c, cr := dialRaw(t, sock)
	if resp := answer(t, c, cr, ""); resp.OK || resp.Code != "too_many_connections" || !strings.Contains(resp.Error, "at most 2") {
		t.Fatalf("the third connection got %+v", resp)
	}
	if _, err := cr.ReadByte(); err != io.EOF {
		t.Fatalf("the refused connection stays open: %v", err)
	}
	a.Close()
	for range 5000 {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n < 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	d, dr := dialRaw(t, sock)
	if resp := answer(t, d, dr, `{"op":"hello"}`); !resp.OK {
		t.Fatalf("hello after a connection closed: %+v", resp)
	}
}

// TestInFlightLimit: the bytes one connection holds of an unterminated
// line count against every other connection's; a line that would pass
// the limit is refused with in_flight_limit, read to its newline without
// being held, and its connection stays usable; when the holder's line is
// answered its bytes are free again.
func TestInFlightLimit(t *testing.T) {
	s := NewServer(echo{})
	s.SetLimits(4, 64<<10)
	sock := serve(t, s)
	a, ar := dialRaw(t, sock)
	b, br := dialRaw(t, sock)
	head := `{"op":"append","data":"`
	// 40 KiB unterminated: the server holds the buffer its reads past
	// the read buffer have grown, 32 KiB; a line of 40 KiB more cannot
	// grow past 32 KiB beside it.
	if _, err := io.WriteString(a, head+strings.Repeat("a", 40<<10)); err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, s, 32<<10)
	big := head + strings.Repeat("b", 40<<10) + `"}`
	if resp := answer(t, b, br, big); resp.OK || resp.Code != "in_flight_limit" {
		t.Fatalf("a line past the limit got %+v", resp)
	}
	if resp := answer(t, b, br, `{"op":"hello"}`); !resp.OK {
		t.Fatalf("the refused connection: %+v", resp)
	}
	if resp := answer(t, a, ar, `"}`); !resp.OK || *resp.Size != 40<<10 {
		t.Fatalf("the holder's line: %+v", resp)
	}
	if resp := answer(t, b, br, big); !resp.OK {
		t.Fatalf("the line once the bytes are free: %+v", resp)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight != 0 {
		t.Fatalf("%d bytes still held with every line answered", s.inFlight)
	}
}

// TestLineCapFollowsInFlight: a line is never longer than the in-flight
// limit.
func TestLineCapFollowsInFlight(t *testing.T) {
	s := NewServer(echo{})
	s.SetLimits(4, 1000)
	if s.maxLine != 1000 {
		t.Fatalf("line cap %d", s.maxLine)
	}
}

// FuzzChannelLine feeds arbitrary bytes to the channel's line reader, with
// small buffers and limits so that every path is reached: every line it
// returns is one of the input's lines, within the cap, every refusal is of
// a line that broke the cap or the budget, the budget is never exceeded
// and always given back; and every line it returns is answered by the
// server's request handling without a panic.
func FuzzChannelLine(f *testing.F) {
	for _, seed := range []string{
		"", "\n", "{}\n", `{"op":"hello"}` + "\n",
		`{"op":"append","data":"x"}` + "\n" + `{"op":"dispatch","id":"c1","kind":"k","payload":{"a":1}}` + "\n",
		`{"op":"await","ids":["c1","c1"]}` + "\n",
		`{"op":"append","data":"AAAA","encoding":"base64"}` + "\n",
		strings.Repeat("x", 100) + "\nshort\n",
		strings.Repeat("y", 40) + "\n" + strings.Repeat("z", 40),
		"\x00\xff\n\n\n", `{"op":"result","id":"` + strings.Repeat("i", 300) + `"}` + "\n",
	} {
		f.Add([]byte(seed), uint8(64), uint8(48))
	}
	f.Fuzz(func(t *testing.T, in []byte, maxLen, budget uint8) {
		maxLen, budget = max(maxLen, 1), max(budget, 1)
		r := bufio.NewReaderSize(bytes.NewReader(in), 16)
		var held int
		take := func(n int) bool {
			if held+n > int(budget) {
				return false
			}
			held += n
			return true
		}
		s := NewServer(echo{})
		want := bytes.Split(in, []byte("\n"))
		for i := 0; ; i++ {
			line, got, err := readLine(r, int(maxLen), take)
			if got != held {
				t.Fatalf("line %d: readLine says it holds %d, took %d", i, got, held)
			}
			held = 0
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				if i < len(want)-1 || (err == io.EOF) != (len(want[i]) == 0) {
					t.Fatalf("line %d of %d: %v", i, len(want), err)
				}
				return
			}
			if i >= len(want)-1 {
				t.Fatalf("line %d: past the input's last newline: %q, %v", i, line, err)
			}
			switch {
			case errors.Is(err, ErrLineTooLong):
				if len(want[i]) <= int(maxLen) {
					t.Fatalf("line %d of %d bytes refused as too long (cap %d)", i, len(want[i]), maxLen)
				}
			case errors.Is(err, ErrInFlight):
				if len(want[i]) <= int(budget) {
					t.Fatalf("line %d of %d bytes refused for a budget of %d", i, len(want[i]), budget)
				}
			case err != nil:
				t.Fatalf("line %d: %v", i, err)
			default:
				if !bytes.Equal(line, want[i]) {
					t.Fatalf("line %d: %q, want %q", i, line, want[i])
				}
				s.handle(context.Background(), line)
			}
		}
	})
}
