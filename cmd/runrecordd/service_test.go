package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/store"
)

// The stop policy: --on-stop as given, park otherwise, whether or not
// systemd started the daemon (NOTIFY_SOCKET or INVOCATION_ID set).
func TestOnStopPolicy(t *testing.T) {
	for _, c := range []struct {
		flag, socket, invocation, want string
	}{
		{"", "", "", onStopPark},
		{"", "/run/systemd/notify", "", onStopPark},
		{"", "", "0123abcd", onStopPark},
		{onStopLeave, "/run/systemd/notify", "0123abcd", onStopLeave},
		{onStopPark, "", "", onStopPark},
	} {
		t.Setenv("NOTIFY_SOCKET", c.socket)
		t.Setenv("INVOCATION_ID", c.invocation)
		if got := onStopPolicy(c.flag); got != c.want {
			t.Errorf("--on-stop=%q, NOTIFY_SOCKET=%q, INVOCATION_ID=%q: %s, want %s", c.flag, c.socket, c.invocation, got, c.want)
		}
	}
}

// The stop's own waits (the socket API's end, the post-copy holds at
// their longest --post-copy-wait, the peer API's end, the daemon's
// shutdown) fit together in the unit's TimeoutStopSec: systemd does not
// kill a stop that parks nothing. Seen failing first: 30 s + 60 s + 30 s.
func TestStopWaitsFitTimeoutStopSec(t *testing.T) {
	b, err := os.ReadFile("../../deploy/systemd/runrecordd.service")
	if err != nil {
		t.Fatal(err)
	}
	var limit time.Duration
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "TimeoutStopSec="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("TimeoutStopSec=%s: %v", v, err)
			}
			limit = time.Duration(n) * time.Second
		}
	}
	if limit == 0 {
		t.Fatal("the unit sets no TimeoutStopSec")
	}
	if sum := apiStopBound + maxPostCopyWait + peerStopBound + daemonStopBound; sum > limit {
		t.Fatalf("the stop waits up to %s, the unit's TimeoutStopSec is %s", sum, limit)
	}
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f.register(fs)
	if f.postCopyWait > maxPostCopyWait {
		t.Fatalf("--post-copy-wait defaults to %s, past its %s", f.postCopyWait, maxPostCopyWait)
	}
}

// holdsFor is a stop's wait for post-copy holds that none ever ends: it
// returns at its context's end, and says when it returned.
type holdsFor struct{ returned time.Time }

func (h *holdsFor) wait(ctx context.Context) ([]store.Hold, error) {
	<-ctx.Done()
	h.returned = time.Now()
	return []store.Hold{{Run: "r"}}, nil
}

// stopped records the context a server's Shutdown was given.
type stopped struct {
	err    error // the context's, at the call
	called time.Time
}

func (s *stopped) Shutdown(ctx context.Context) error {
	s.err, s.called = ctx.Err(), time.Now()
	return nil
}

// After the runs are parked, the stop waits for the post-copy holds
// (within --post-copy-wait), and only then ends the peer API, with a
// context of its own: the targets fetch through the wait, and the peer
// API's end is never handed an expired context.
func TestStopWaitsHoldsThenEndsPeers(t *testing.T) {
	h := &holdsFor{}
	p := &stopped{}
	s := &service{onStop: onStopLeave, postCopyWait: 50 * time.Millisecond, holds: h.wait, log: slog.New(slog.DiscardHandler)}
	start := time.Now()
	if err := s.stopServing(p); err != nil {
		t.Fatal(err)
	}
	if h.returned.IsZero() || p.called.Before(h.returned) {
		t.Fatalf("the holds' wait returned at %v, the peer API ended at %v", h.returned, p.called)
	}
	if waited := p.called.Sub(start); waited < 50*time.Millisecond {
		t.Fatalf("the peer API ended %s into the stop, before --post-copy-wait's 50ms", waited)
	}
	if p.err != nil {
		t.Fatalf("the peer API's end got a context ended: %v", p.err)
	}
}
