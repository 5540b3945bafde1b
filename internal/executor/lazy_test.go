//go:build linux

package executor_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/executor"
)

// TestRestoreLazy restores the oracle lazily (the prototype of
// docs/lazy-resume.md): the unit runs before its buffer is resident, both
// of its processes' userfaultfds can be held, every page arrives (the
// lazy-pages daemon exits cleanly), the restored process goes on as the
// same run with its buffer intact, and a later checkpoint of the sandbox is
// an ordinary one that holds the whole buffer.
func TestRestoreLazy(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "lazy"
	s := mustStart(t, id, spec, out)
	before := last(waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt >= 10 }))
	cp, atDump := checkpointAway(t, s, out)

	s, lp, rst, err := client.RestoreLazy(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, s) })
	// Far fewer than the buffer's 16,384 pages were restored eagerly.
	if rst.PagesRestored >= 64<<20/4096 {
		t.Errorf("the lazy restore restored %d pages eagerly", rst.PagesRestored)
	}
	n, release, err := lp.HoldUffds()
	if err != nil {
		t.Fatal(err)
	}
	// One per task, the oracle and its child: lazy-pages keeps a task
	// whose pages are all in until every task's are
	// (deploy/criu/2-lazy-pages-keep-uffds.patch); or none, when it had
	// brought every page in and exited before the restore returned.
	// Without the patch, a task's may be gone already: at most 2.
	exited := false
	select {
	case <-lp.Done():
		exited = true
	default:
	}
	if why := criuBuild(t).Lacks(criu.KeepsUffds); why != "" {
		t.Logf("not checked that every userfaultfd is held: %s", why)
		if n > 2 {
			t.Errorf("held %d userfaultfds, want at most 2", n)
		}
	} else if n != 2 && (n != 0 || !exited) {
		t.Errorf("held %d userfaultfds (lazy-pages exited: %v), want 2, or 0 after its exit", n, exited)
	}
	<-lp.Done()
	release()
	if client.LazyRestoring(id) || client.LazyUnfinished(id) {
		t.Error("LazyRestoring or LazyUnfinished after lazy-pages exited, every page in")
	}
	resident, err := lp.Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore %v (task %v, %d pages eager); every page resident %v after lazy-pages started", rst.Total, rst.Task, rst.PagesRestored, resident)

	ls := waitLines(t, out.Stdout, "a line verified after the restore", func(ls []line) bool { return last(ls).VerifiedAt > atDump.Counter })
	for i, l := range ls {
		if l.Counter != uint64(i+1) || l.Checksum != before.Checksum || l.Verify != before.Checksum || !l.FileOK ||
			l.StartTime != before.StartTime || l.Pid != before.Pid || l.ChildPid != before.ChildPid {
			t.Fatalf("line %d %+v; first %+v", i, l, before)
		}
	}

	// The sandbox's next dump writes every page of the buffer, even with
	// the lazy-pages line a daemon that crashed between the restore and
	// the configuration's repair would have left (the dump repairs it).
	// (A dump with lazy-pages would wait for a page server: the deadline
	// bounds it.)
	if err := client.LeaveLazyConfigForTest(id); err != nil {
		t.Fatal(err)
	}
	cp2 := executor.Checkpoint{ImageDir: filepath.Join(filepath.Dir(cp.ImageDir), "images2"), Keep: true, Deadline: 20 * time.Second}
	st, err := s.Checkpoint(ctx, cp2)
	if err != nil {
		t.Fatal(err)
	}
	if st.PagesWritten < 64<<20/4096 {
		t.Fatalf("a checkpoint after the lazy restore wrote %d pages, want the 64 MiB buffer", st.PagesWritten)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}
