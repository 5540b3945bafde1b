package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// killRound is the experiment of a lazy-pages daemon that dies mid-way:
// one lazy resume, the daemon killed after the unit runs, then what the
// unit does is reported: its lines for a while (a verification of every
// page reports zeroed pages), its exit, or its state if it neither
// prints nor exits.
//
// With hold, the bench holds copies of the daemon's userfaultfds
// (LazyPages.HoldUffds) across the kill, reports the unit's state, and
// only then closes them.
func (b *bench) killRound(ctx context.Context, after time.Duration, hold bool) error {
	b.verify = 2 // a full verification every half second
	p, err := b.park(ctx, "lb-kill", false)
	if err != nil {
		return err
	}
	defer p.close()
	if err := settle(); err != nil {
		return err
	}
	skip := countLines(p.out.Stdout)
	trees, _, dir, err := b.resumeTrees(ctx, p, "lazy")
	if err != nil {
		return err
	}
	if err := links(p, trees.ImageDir); err != nil {
		return err
	}
	cp := executor.Checkpoint{ImageDir: trees.ImageDir, Rootfs: trees.Rootfs}
	sb, lp, _, err := b.ex.RestoreLazy(ctx, p.id, b.spec(), cp, p.out)
	os.RemoveAll(dir)
	if err != nil {
		return err
	}
	defer sb.Destroy(context.Background())
	pid := sb.Pid()
	if hold {
		n, release, err := lp.HoldUffds()
		if err != nil {
			return err
		}
		fmt.Printf("holding %d userfaultfd(s) of criu lazy-pages\n", n)
		defer func() {
			state(pid)
			fmt.Println("closing the held userfaultfd(s)")
			release()
		}()
	}
	fmt.Printf("unit running, pid %d, RSS %d KiB; killing criu lazy-pages (pid %d) in %s\n", pid, rss(pid), lp.Pid(), after)
	time.Sleep(after)
	lp.Kill()
	_, lerr := lp.Result()
	fmt.Printf("lazy-pages killed; RSS %d KiB; Result: %v\n", rss(pid), lerr)
	exited := make(chan uint32, 1)
	go func() {
		code, _ := sb.Wait(context.Background())
		exited <- code
	}()
	select {
	case code := <-exited:
		fmt.Printf("the unit exited with status %d\n", code)
	case <-time.After(5 * time.Second):
		fmt.Println("the unit is still there after 5s")
		state(pid)
	}
	data, _ := os.ReadFile(p.out.Stdout)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if skip < len(lines) {
		fmt.Printf("its lines since the restore:\n%s\n", strings.Join(lines[skip:], "\n"))
	}
	if e, _ := os.ReadFile(p.out.Stderr); len(e) > 0 {
		if len(e) > 2000 {
			e = e[:2000]
		}
		fmt.Printf("its stderr (head):\n%s\n", e)
	}
	return nil
}

// state prints the state of every thread of process pid and its RSS.
func state(pid uint32) {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, t.Name()))
		f := strings.Fields(string(st))
		if len(f) > 2 {
			fmt.Printf("  thread %s state %s wchan %s\n", t.Name(), f[2], wchan)
		}
	}
	fmt.Printf("  RSS %d KiB\n", rss(pid))
}

// links prints, for the memory image's pages files, the inode of the
// stored object and of the laid-out file the lazy-pages daemon reads: the
// same inode, so every page served is a byte of the verified object.
func links(p *parked, images string) error {
	es, err := p.st.Listing(*p.res.Snapshot.Memory)
	if err != nil {
		return err
	}
	for _, e := range es {
		if !strings.HasPrefix(e.Name, "pages-") {
			continue
		}
		var obj, laid syscall.Stat_t
		if err := syscall.Stat(p.st.Path(e.Address), &obj); err != nil {
			return err
		}
		if err := syscall.Stat(filepath.Join(images, e.Name), &laid); err != nil {
			return err
		}
		fmt.Printf("%s (%d bytes): object %s inode %d; laid out inode %d, %d links, mode %o\n",
			e.Name, e.Size, e.Address, obj.Ino, laid.Ino, laid.Nlink, laid.Mode&0o7777)
	}
	return nil
}
