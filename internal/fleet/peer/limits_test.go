package peer

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// blocking is an admission check that holds each read until release is
// closed, counting reads and the most under way at once.
type blocking struct {
	release    chan struct{}
	reads, now atomic.Int32
	most       atomic.Int32
	role       fleet.Role
	err        error
	mu         sync.Mutex
	keys       map[record.Address]int
}

func newBlocking(role fleet.Role, err error) *blocking {
	return &blocking{release: make(chan struct{}), role: role, err: err, keys: map[record.Address]int{}}
}

func (b *blocking) admitted(ctx context.Context, key record.Address) (fleet.Role, error) {
	b.reads.Add(1)
	b.mu.Lock()
	b.keys[key]++
	b.mu.Unlock()
	n := b.now.Add(1)
	defer b.now.Add(-1)
	for {
		m := b.most.Load()
		if n <= m || b.most.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-b.release:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return b.role, b.err
}

func keyN(i int) record.Address { return record.Sum([]byte{byte(i), byte(i >> 8), 'k'}) }

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A gate lets DefaultReads reads run at once, whatever the handshakes
// waiting: 100 keys, 16 reads under way, the rest waiting, all answered
// once the reads end.
func TestGateBoundsReads(t *testing.T) {
	b := newBlocking(fleet.RoleHost, nil)
	admit := Gate(b.admitted, GateLimits{})
	var wg sync.WaitGroup
	var ok atomic.Int32
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := admit(context.Background(), keyN(i)); err == nil {
				ok.Add(1)
			}
		}()
	}
	waitFor(t, "16 reads under way", func() bool { return b.now.Load() == DefaultReads })
	time.Sleep(50 * time.Millisecond)
	if n := b.now.Load(); n != DefaultReads {
		t.Fatalf("%d reads under way, want %d", n, DefaultReads)
	}
	close(b.release)
	wg.Wait()
	if ok.Load() != 100 || b.most.Load() != DefaultReads || b.reads.Load() != 100 {
		t.Fatalf("%d admitted, at most %d reads at once, %d reads", ok.Load(), b.most.Load(), b.reads.Load())
	}
}

// Handshakes of one key share its read: 50 at once make one read, and
// every one gets its answer.
func TestGateOneReadPerKey(t *testing.T) {
	b := newBlocking(fleet.RolePlatform, nil)
	admit := Gate(b.admitted, GateLimits{})
	var wg sync.WaitGroup
	var ok atomic.Int32
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if role, err := admit(context.Background(), keyN(1)); err == nil && role == fleet.RolePlatform {
				ok.Add(1)
			}
		}()
	}
	waitFor(t, "the read under way", func() bool { return b.now.Load() == 1 })
	time.Sleep(50 * time.Millisecond)
	close(b.release)
	wg.Wait()
	if ok.Load() != 50 || b.reads.Load() != 1 {
		t.Fatalf("%d admitted by %d reads, want 50 by 1", ok.Load(), b.reads.Load())
	}
}

// A key refused as not admitted is refused without a read until its TTL
// passes, then read again; an admission is read afresh every time, and so
// is an answer that was not a refusal (etcd unavailable).
func TestGateRemembersRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		err         error
		reads       int32 // after three admissions in a row
		remembering bool
	}{
		"refused":     {fleet.ErrNotAdmitted, 1, true},
		"admitted":    {nil, 3, false},
		"unavailable": {fleet.ErrUnavailable, 3, false},
	} {
		t.Run(name, func(t *testing.T) {
			b := newBlocking(fleet.RoleHost, tc.err)
			close(b.release)
			admit := Gate(b.admitted, GateLimits{RefusalTTL: 200 * time.Millisecond})
			for range 3 {
				if _, err := admit(context.Background(), keyN(2)); !errors.Is(err, tc.err) && (tc.err != nil || err != nil) {
					t.Fatalf("admit: %v, want %v", err, tc.err)
				}
			}
			if n := b.reads.Load(); n != tc.reads {
				t.Fatalf("%d reads for 3 admissions, want %d", n, tc.reads)
			}
			if !tc.remembering {
				return
			}
			time.Sleep(250 * time.Millisecond)
			_, _ = admit(context.Background(), keyN(2))
			if n := b.reads.Load(); n != 2 {
				t.Fatalf("after the TTL: %d reads, want 2", n)
			}
		})
	}
}

// A gate remembers at most Refusals keys: a flood of new keys forgets the
// oldest.
func TestGateRefusalsBounded(t *testing.T) {
	b := newBlocking("", fleet.ErrNotAdmitted)
	close(b.release)
	admit := Gate(b.admitted, GateLimits{Refusals: 10})
	for i := range 1000 {
		_, _ = admit(context.Background(), keyN(i))
	}
	_, _ = admit(context.Background(), keyN(999)) // remembered: no read
	_, _ = admit(context.Background(), keyN(0))   // forgotten: read again
	if n := b.reads.Load(); n != 1001 {
		t.Fatalf("%d reads, want 1001", n)
	}
}

// A handshake whose context ends while it waits for a read slot is
// refused as unconfirmed, and made no read.
func TestGateWaitEnds(t *testing.T) {
	b := newBlocking(fleet.RoleHost, nil)
	defer close(b.release)
	admit := Gate(b.admitted, GateLimits{Reads: 1})
	go func() { _, _ = admit(context.Background(), keyN(1)) }()
	waitFor(t, "the first read", func() bool { return b.now.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := admit(ctx, keyN(2)); !errors.Is(err, ErrUnconfirmed) || b.reads.Load() != 1 {
		t.Fatalf("admit while every slot is taken: %v (%d reads)", err, b.reads.Load())
	}
}

// closedAtOnce dials addr from source ip and reports whether the server
// closed the connection within d without a byte.
func closedAtOnce(t *testing.T, addr, ip string, d time.Duration) (bool, net.Conn) {
	t.Helper()
	dl := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := dl.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err = c.Read(make([]byte, 1))
	_ = c.SetReadDeadline(time.Time{})
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, c
	}
	c.Close()
	return true, nil
}

// The listener holds PerSource connections from one address and Conns in
// all; one more is closed as it is accepted. A connection that never ends
// its handshake is cut at the deadline, and its place is free again.
func TestListenLimits(t *testing.T) {
	cfg := ServerConfig(newKey(t), roles(nil))
	ln, err := Listen("127.0.0.1:0", cfg, Limits{Conns: 3, PerSource: 2, Handshake: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	var open []net.Conn
	for _, ip := range []string{"127.0.0.1", "127.0.0.1", "127.0.0.2"} {
		closed, c := closedAtOnce(t, addr, ip, 100*time.Millisecond)
		if closed {
			t.Fatalf("a connection from %s within the limits closed", ip)
		}
		open = append(open, c)
	}
	if closed, _ := closedAtOnce(t, addr, "127.0.0.3", 300*time.Millisecond); !closed {
		t.Fatal("a connection past the total limit was kept")
	}
	began := time.Now()
	for _, c := range open {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a byte from a server waiting for a ClientHello")
		}
		c.Close()
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("stalled handshakes cut after %v, the deadline is 500 ms", took)
	}
	// Places are free again: one source's two, then a third is closed.
	for i := range 3 {
		closed, c := closedAtOnce(t, addr, "127.0.0.1", 200*time.Millisecond)
		if closed != (i == 2) {
			t.Fatalf("connection %d from one source after the cut: closed %v", i, closed)
		}
		if c != nil {
			defer c.Close()
		}
	}
}
