//go:build linux

package pageserver

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// lazyPagesOf is a LazyPages of a process that ran name and exited.
func lazyPagesOf(t *testing.T, name string) *LazyPages {
	t.Helper()
	cmd := exec.Command(name)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &LazyPages{cmd: cmd, start: time.Now(), done: make(chan struct{})}
	l.wait()
	return l
}

// A lazy-pages that has brought every page in and exited before its
// userfaultfds are asked for leaves nothing to hold, and that is no
// error: a small unit's pages can all arrive before the restore returns.
// One that exited failing answers its failure.
func TestHoldUffdsAfterExit(t *testing.T) {
	n, release, err := lazyPagesOf(t, "true").HoldUffds()
	if err != nil || n != 0 || release == nil {
		t.Fatalf("after a clean exit: %d held, release %v, %v", n, release != nil, err)
	}
	release()
	if _, _, err := lazyPagesOf(t, "false").HoldUffds(); !errors.Is(err, ErrPagesLost) {
		t.Fatalf("after a failed exit: %v", err)
	}
}

// Record may run while lazy-pages exits (every page in before the
// restore returns): whichever comes first, the race detector sees no race
// between the two, and after a clean exit the pids stay recorded until
// the unit is settled (SetUnit: its ranges unregistered), then none is.
func TestRecordWhileExiting(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &LazyPages{cmd: cmd, start: time.Now(), done: make(chan struct{})}
	go l.wait()
	p := Pids{Dir: t.TempDir(), Work: "/nonexistent"}
	if err := p.Record(l); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if _, err := l.Result(); err != nil {
		t.Fatal(err)
	}
	if !p.Unfinished() {
		t.Fatal("the pids removed after a clean exit, before the unit's ranges were unregistered")
	}
	if _, ok := p.Settled(); ok {
		t.Fatal("settled before the unit's ranges were unregistered")
	}
	l.SetUnit(os.Getpid()) // no range of this process is registered
	if p.Unfinished() {
		t.Fatal("a pid left recorded after a clean exit and SetUnit")
	}
	if at, ok := p.Settled(); !ok || !at.Equal(l.ExitedAt()) {
		t.Fatalf("settled at %v (%v), want lazy-pages' exit, %v", at, ok, l.ExitedAt())
	}
	// A restore settled before its pids are recorded writes only when
	// it settled, over an earlier restore's.
	q := Pids{Dir: t.TempDir(), Work: "/nonexistent"}
	if err := os.WriteFile(filepath.Join(q.Dir, residentAt), []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := q.Record(l); err != nil {
		t.Fatal(err)
	}
	if at, ok := q.Settled(); q.Unfinished() || !ok || !at.Equal(l.ExitedAt()) {
		t.Fatalf("recorded once settled: unfinished %v, settled at %v (%v)", q.Unfinished(), at, ok)
	}
}
