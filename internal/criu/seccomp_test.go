package criu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"google.golang.org/protobuf/proto"
)

// hostFilter is a filter of n instructions standing for the host's
// (RET ALLOW, which no image's filter is byte for byte).
func hostFilter(n int) Filter {
	b := make([]byte, 0, 8*n)
	for range n {
		b = append(b, 0x06, 0, 0, 0, 0, 0, 0xff, 0x7f)
	}
	return Filter{Insns: b}
}

// chain is thread tid's filters in the order CRIU installs them.
func chain(t *testing.T, im *Images, tid uint32) [][]byte {
	t.Helper()
	th := im.Cores[tid].GetThreadCore()
	if th.GetSeccompMode() != criucore.SeccompMode_filter || th.SeccompFilter == nil {
		t.Fatalf("thread %d: seccomp mode %s, filter %v", tid, th.GetSeccompMode(), th.SeccompFilter)
	}
	var out [][]byte
	fs := im.Seccomp.GetSeccompFilters()
	for i, more := th.GetSeccompFilter(), true; more; {
		f := fs[i]
		if f.GetFlags()&seccompTsync != 0 {
			t.Errorf("thread %d: filter %d keeps TSYNC", tid, i)
		}
		out = append(out, f.GetFilter())
		i, more = f.GetPrev(), f.Prev != nil
	}
	return out
}

// TestStack: every thread of the oracle (whose threads share their
// leader's filters, TSYNC) is restored with the host's filters first,
// then its own; the rewritten images decode, pass the judge, and keep
// their files' modes.
func TestStack(t *testing.T) {
	dir := oracle(t)
	if err := os.Chmod(filepath.Join(dir, "core-7.img"), 0o400); err != nil {
		t.Fatal(err)
	}
	before, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	own := map[uint32][]byte{} // each task's own filter
	for _, tk := range before.Tasks {
		own[tk.GetPid()] = before.Seccomp.GetSeccompFilters()[before.Cores[tk.GetPid()].GetThreadCore().GetSeccompFilter()].GetFilter()
	}
	host := []Filter{hostFilter(3), hostFilter(5)}
	if err := before.Stack(dir, host); err != nil {
		t.Fatal(err)
	}
	im, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Judge(mustPolicy(t)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tk := range im.Tasks {
		for _, tid := range tk.GetThreads() {
			n++
			c := chain(t, im, tid)
			if len(c) != 3 || !bytes.Equal(c[0], host[0].Insns) || !bytes.Equal(c[1], host[1].Insns) || !bytes.Equal(c[2], own[tk.GetPid()]) {
				t.Errorf("thread %d of %d: a chain of %d filters, not the host's two then the task's own", tid, tk.GetPid(), len(c))
			}
		}
	}
	if n != 10 {
		t.Fatalf("%d threads", n)
	}
	// One copy of the host's filters for each chain of the images.
	if got := len(im.Seccomp.GetSeccompFilters()); got != 2+2*2 {
		t.Errorf("%d filters in seccomp.img", got)
	}
	if fi, err := os.Stat(filepath.Join(dir, "core-7.img")); err != nil || fi.Mode().Perm() != 0o400 {
		t.Errorf("core-7.img: %v, %v: its mode not kept", fi.Mode(), err)
	}
	// Stacked again (a park of the restored unit, restored here), the
	// chains hold the host's filters already: they do not grow.
	if err := im.Stack(dir, host); err != nil {
		t.Fatal(err)
	}
	again, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(again.Seccomp.GetSeccompFilters()); got != 6 {
		t.Errorf("stacked twice: %d filters in seccomp.img, want 6", got)
	}
	for _, tk := range again.Tasks {
		for _, tid := range tk.GetThreads() {
			if c := chain(t, again, tid); len(c) != 3 {
				t.Errorf("stacked twice: thread %d has %d filters", tid, len(c))
			}
		}
	}
	// Another host's filter (another runc) is stacked once more.
	if err := again.Stack(dir, []Filter{hostFilter(7)}); err != nil {
		t.Fatal(err)
	}
	if im, err = Read(dir); err != nil {
		t.Fatal(err)
	}
	if c := chain(t, im, 7); len(c) != 4 || !bytes.Equal(c[0], hostFilter(7).Insns) {
		t.Errorf("another host's filter: thread 7 has %d filters", len(c))
	}
}

// TestStackOnThreadsOwnFilters: threads with filters of their own (no
// TSYNC) each get the host's in front of theirs.
func TestStackOnThreadsOwnFilters(t *testing.T) {
	dir := oracle(t)
	noTsync(t, dir)
	for _, tid := range []string{"7", "8", "9", "10", "13"} {
		rewrite(t, dir, "core-"+tid+".img", &criucore.CoreEntry{}, func(c *criucore.CoreEntry) {
			c.ThreadCore.SeccompMode, c.ThreadCore.SeccompFilter = criucore.SeccompMode_filter.Enum(), proto.Uint32(1)
		})
	}
	before, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Without TSYNC, task 12's threads hold no filter: refused.
	var re *RefusedError
	if err := before.Stack(dir, []Filter{hostFilter(1)}); !errors.As(err, &re) || re.Task != 12 || re.Field != "thread_core.seccomp_mode" {
		t.Fatalf("%v; want task 12's thread refused", err)
	}
	for _, tid := range []string{"14", "15", "16"} {
		rewrite(t, dir, "core-"+tid+".img", &criucore.CoreEntry{}, func(c *criucore.CoreEntry) {
			c.ThreadCore.SeccompMode, c.ThreadCore.SeccompFilter = criucore.SeccompMode_filter.Enum(), proto.Uint32(0)
		})
	}
	before, err = Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := before.Stack(dir, []Filter{hostFilter(1)}); err != nil {
		t.Fatal(err)
	}
	im, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range im.Tasks {
		for _, tid := range tk.GetThreads() {
			if c := chain(t, im, tid); len(c) != 2 || !bytes.Equal(c[0], hostFilter(1).Insns) {
				t.Errorf("thread %d: %d filters, not the host's then its own", tid, len(c))
			}
		}
	}
}

// TestStackPastTheKernelsBound: a chain the host's filter would take
// past the kernel's instructions per thread is refused, not restored to
// fail.
func TestStackPastTheKernelsBound(t *testing.T) {
	im, err := Read("testdata/oracle")
	if err != nil {
		t.Fatal(err)
	}
	host := make([]Filter, 8)
	for i := range host {
		host[i] = hostFilter(maxFilterInsns)
	}
	var re *RefusedError
	if err := im.Stack(t.TempDir(), host); !errors.As(err, &re) || re.Image != "seccomp.img" {
		t.Fatalf("%v; want seccomp.img refused", err)
	}
}
