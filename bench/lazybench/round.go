package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// line is the ballast's report (units/ballast).
type line struct {
	Counter   uint64 `json:"counter"`
	Verified  uint64 `json:"verified_at"`
	StartTime int64  `json:"start_time"`
	Time      int64  `json:"time"`
	Error     string `json:"error"`
}

// parked is a unit parked into its own store, ready to resume.
type parked struct {
	id    string
	st    *store.Store
	res   park.Result
	out   executor.Output
	ready line
	last  line // its last line before the park
}

func (b *bench) spec() executor.Spec {
	s := executor.Spec{Image: imageName(b.unit), Network: unit.NoNetwork, MemoryBytes: uint64(b.sizeMB+256) << 20,
		Env: []string{"SIZE_MB=" + strconv.Itoa(b.sizeMB), "TICK_MS=250", "VERIFY_EVERY=" + strconv.Itoa(b.verify)}}
	if b.unit == "oracle" {
		// Its TCP state needs loopback: a held connection restored with
		// TCP repair (tcp-established), a fresh one every tick.
		s.Network = unit.Loopback
		s.Env = append(s.Env, "TCP_PORT=7000")
	}
	return s
}

// park starts a ballast unit, waits for its ready line, parks it into a
// fresh store and destroys its sandbox.
func (b *bench) park(ctx context.Context, id string, chunked bool) (*parked, error) {
	st, err := store.Open(filepath.Join(b.dir, "store-"+id))
	if err != nil {
		return nil, err
	}
	st.SetChunkedImages(chunked)
	p := &parked{id: id, st: st, out: executor.Output{Stdout: filepath.Join(b.dir, id+".out"), Stderr: filepath.Join(b.dir, id+".err")}}
	sb, err := b.ex.Start(ctx, id, b.spec(), p.out)
	if err != nil {
		return nil, errors.Join(err, p.close())
	}
	p.ready, err = nextLine(p.out.Stdout, 0, 60*time.Second)
	if err == nil {
		p.res, err = park.Image(ctx, st, sb, park.ImageOptions{})
	}
	if derr := sb.Destroy(ctx); err == nil {
		err = derr
	}
	if err == nil {
		// Destroy drained its output: the last line the parked process wrote.
		p.last, err = lastLine(p.out.Stdout)
	}
	if err != nil {
		return nil, errors.Join(err, p.close())
	}
	return p, nil
}

func (p *parked) close() error {
	err := p.st.Close()
	return errors.Join(err, os.RemoveAll(p.st.Dir()))
}

// settle writes everything back and drops the page cache (bench/park.sh).
func settle() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

// noPrefetch ends a mode whose resume does not prefetch the restore's
// programs (executor.Client.Prefetch), to compare with one that does.
const noPrefetch = "-noprefetch"

// resumeTrees is the daemon's resume up to the restore: the snapshot's
// identity (every stored byte rehashed), then the hard-linked layout.
func (b *bench) resumeTrees(ctx context.Context, p *parked, mode string) (park.Trees, *pageserver.Table, string, error) {
	t0 := time.Now()
	kind, off := strings.CutSuffix(mode, noPrefetch)
	if !off {
		b.ex.Prefetch() // as forms.Admit does
	}
	offered := p.res.Snapshot
	offer := park.Offered
	if kind == "served" {
		offer = park.OfferedServed
	}
	if !strings.HasSuffix(mode, "-cold") { // a -cold mode measures the restore from a cold page cache
		o, err := offer(ctx, p.st, p.res.Snapshot)
		if err != nil {
			return park.Trees{}, nil, "", err
		}
		if o.String() != offered.String() {
			return park.Trees{}, nil, "", fmt.Errorf("the store offers %s, the park made %s", o, offered)
		}
	}
	t1 := time.Now()
	dir := filepath.Join(b.dir, "restore-"+p.id)
	var trees park.Trees
	var m *pageserver.Table
	var err error
	if kind == "served" {
		trees, m, err = park.LayoutServed(p.st, offered, dir)
	} else {
		trees, err = park.Layout(p.st, offered, dir)
	}
	if err != nil {
		return park.Trees{}, nil, "", err
	}
	b.add(mode+" rehash", t1.Sub(t0))
	b.add(mode+" layout", time.Since(t1))
	return trees, m, dir, nil
}

// round parks a fresh unit and resumes it in mode (eager or lazy).
func (b *bench) round(ctx context.Context, r int, mode string) error {
	served := strings.TrimSuffix(mode, noPrefetch) == "served"
	p, err := b.park(ctx, fmt.Sprintf("lb-%s-%d", mode, r), served)
	if err != nil {
		return err
	}
	defer p.close()
	if err := settle(); err != nil {
		return err
	}
	skip := countLines(p.out.Stdout)
	t0 := time.Now()
	trees, pages, dir, err := b.resumeTrees(ctx, p, mode)
	if err != nil {
		return err
	}
	t1 := time.Now()
	cp := executor.Checkpoint{ImageDir: trees.ImageDir, Rootfs: trees.Rootfs, Pages: pages}
	var sb *executor.Sandbox
	var lp *pageserver.LazyPages
	var rst executor.RestoreStats
	if strings.HasPrefix(mode, "lazy") || served {
		sb, lp, rst, err = b.ex.RestoreLazy(ctx, p.id, b.spec(), cp, p.out)
	} else {
		sb, rst, err = b.ex.Restore(ctx, p.id, b.spec(), cp, p.out)
	}
	t2 := time.Now()
	os.RemoveAll(dir) // as the daemon does once the restore returns
	if err != nil {
		return err
	}
	defer sb.Destroy(context.Background())
	b.add(mode+" restore", t2.Sub(t1))
	b.add(mode+" rootfs", rst.Rootfs)
	b.add(mode+" task", rst.Task)
	b.add(mode+" newtask", rst.NewTask)
	b.add(mode+" criu", rst.Restore+rst.Forking)
	b.add(mode+" resume", t2.Sub(t0))
	rssRun := rss(sb.Pid())
	if lp != nil && rst.PagesRestored > 10000 {
		b.explain(p.id, rst)
	}
	resident, uffds := time.Duration(0), 0
	if lp != nil {
		// As the design says the daemon does: hold the userfaultfds
		// until every page is resident.
		n, release, err := lp.HoldUffds()
		if err != nil {
			return err
		}
		uffds = n
		<-lp.Done()
		release()
		resident = time.Since(t1)
		if _, err := lp.Result(); err != nil {
			return err
		}
		b.add(mode+" resident", resident)
		lcpu, scpu := lp.CPU()
		b.add(mode+" cpu-lazy", lcpu)
		b.add(mode+" cpu-server", scpu)
		b.keepLogs(p.id)
		b.rss[mode+" running"] = append(b.rss[mode+" running"], rssRun)
		b.rss[mode+" resident"] = append(b.rss[mode+" resident"], rss(sb.Pid()))
	}
	pass, err := b.check(p, skip)
	if err != nil {
		return err
	}
	b.add(mode+" pass", pass.Sub(t1))
	if b.unit == "oracle" {
		data, _ := os.ReadFile(p.out.Stdout)
		ls := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Printf("%s: %d userfaultfd(s); its last line: %s\n", p.id, uffds, ls[len(ls)-1])
	}
	fmt.Printf("round %d %-10s rehash %5s restore %5s (rw layer %3s, task %5s: create %4s, CRIU %5s, %6d pages eager) resume %5s resident %5s  RSS at running %d KiB\n", r, mode,
		ms(b.results[mode+" rehash"][r-1]), ms(t2.Sub(t1)), ms(rst.Rootfs), ms(rst.Task), ms(rst.NewTask), ms(rst.Restore+rst.Forking), rst.PagesRestored,
		ms(t2.Sub(t0)), ms(resident), rssRun)
	return nil
}

// check waits for the unit's first line after the restore (its start time
// the same: it continued) and for the first verification of every page
// after the restore, and returns when that verification ended.
func (b *bench) check(p *parked, skip int) (time.Time, error) {
	v := p.last.Verified
	for {
		l, err := nextLine(p.out.Stdout, skip, 30*time.Second)
		if err != nil {
			return time.Time{}, err
		}
		if l.StartTime != p.ready.StartTime {
			return time.Time{}, fmt.Errorf("the unit restarted (start time %d, was %d)", l.StartTime, p.ready.StartTime)
		}
		if l.Verified != v {
			return time.Unix(0, l.Time), nil
		}
		skip++
	}
}

// nextLine waits for line skip+1 of the ballast's output; a line with an
// error is an error.
func nextLine(path string, skip int, wait time.Duration) (line, error) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(path)
		lines := bytes.Split(data, []byte("\n"))
		if len(lines) > skip+1 { // the last element is what follows the last newline
			var l line
			if err := json.Unmarshal(lines[skip], &l); err != nil {
				return l, fmt.Errorf("line %d of %s: %w", skip+1, path, err)
			}
			if l.Error != "" {
				return l, fmt.Errorf("the unit reports: %s", l.Error)
			}
			return l, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return line{}, fmt.Errorf("no line %d in %s after %s", skip+1, path, wait)
}

func countLines(path string) int {
	data, _ := os.ReadFile(path)
	return bytes.Count(data, []byte("\n"))
}

// rss is a process's resident set, KiB (smaps_rollup).
func rss(pid uint32) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Rss:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, "kB")), 10, 64)
			return n
		}
	}
	return -1
}

// keepLogs copies the CRIU logs of sandbox id's restore into -logs.
func (b *bench) keepLogs(id string) {
	if b.logs == "" {
		return
	}
	work := filepath.Join(b.ex.Config().StateDir, "criu", id, "restore")
	for _, name := range []string{"restore.log", "lazy-pages.log", "page-server.log"} {
		if data, err := os.ReadFile(filepath.Join(work, name)); err == nil {
			_ = os.WriteFile(filepath.Join(b.logs, id+"-"+name), data, 0o600)
		}
	}
}

// explain prints what CRIU's restore log says about lazy pages, for a lazy
// restore that restored its memory eagerly after all.
func (b *bench) explain(id string, rst executor.RestoreStats) {
	data, _ := os.ReadFile(filepath.Join(b.ex.Config().StateDir, "criu", id, "restore", "restore.log"))
	fmt.Printf("%s: a lazy restore restored %d pages eagerly; its restore.log says:\n", id, rst.PagesRestored)
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if n < 30 && (strings.Contains(l, "onfig") || strings.Contains(l, "azy") || strings.Contains(l, "uffd")) {
			fmt.Println("  ", l)
			n++
		}
	}
}

func lastLine(path string) (line, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return line{}, err
	}
	ls := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	var l line
	err = json.Unmarshal(ls[len(ls)-1], &l)
	return l, err
}
