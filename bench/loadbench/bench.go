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
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/ociarchive"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

const image = "runrecordd.bench/oracle:1"

// opWait bounds one park or resume: long enough for a queue of them.
const opWait = 10 * time.Minute

type bench struct {
	c     config
	d     *daemon
	ids   []string
	times map[string][]time.Duration
	// steps is where the daemon says each park and resume spent its
	// time (its answer's steps and, for a resume, its restore's parts),
	// and "wait", the client's time less the daemon's: the run's lock
	// and the API (report prints their p50 and p99).
	steps map[string][]time.Duration
	// atPark is each run's output at its last park: the number of lines
	// and the last one.
	atPark map[string]parked
	cut    int // operations the kill cut short
	mu     sync.Mutex
}

type parked struct {
	lines int
	last  line
}

// line is the oracle's report (units/oracle's Line): the fields checked.
type line struct {
	Counter     uint64 `json:"counter"`
	Checksum    string `json:"checksum"`
	Verify      string `json:"verify"`
	VerifiedAt  uint64 `json:"verified_at"`
	FileOffset  int64  `json:"file_offset"`
	FileOK      bool   `json:"file_ok"`
	PipeSeq     uint64 `json:"pipe_seq"`
	LoUp        bool   `json:"lo_up"`
	TCPHeld     uint64 `json:"tcp_held"`
	TCPHeldPort int    `json:"tcp_held_port"`
	TCPMPTCP    bool   `json:"tcp_mptcp"`
	Pid         int    `json:"pid"`
	ChildPid    int    `json:"child_pid"`
	StartTime   int64  `json:"start_time"`
	Error       string `json:"error"`
}

// startOracles imports the oracle and starts the runs, each in a
// sandbox with loopback (its TCP state), and waits for each one's first
// verified line.
func (b *bench) startOracles(ctx context.Context) error {
	prog, err := ociarchive.GoBinary(ctx, ".", "./units/oracle")
	if err != nil {
		return err
	}
	archive := filepath.Join(b.c.dir, "oracle.tar")
	if _, err := ociarchive.WriteFile(archive, ociarchive.Unit(image, prog)); err != nil {
		return err
	}
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	_, err = b.d.c.ImportImage(ctx, f, image)
	f.Close()
	if err != nil {
		return fmt.Errorf("importing the oracle: %w", err)
	}
	env := []string{"SIZE_MB=" + strconv.Itoa(b.c.sizeMB), "TICK_MS=100", "VERIFY_EVERY=" + strconv.Itoa(b.c.verifyEvery), "TCP_PORT=7777"}
	for i := range b.c.n {
		id := fmt.Sprintf("load-%02d", i)
		r, err := b.d.c.Start(ctx, api.RunRequest{ID: id, Unit: unit.Spec{Image: image, Env: env},
			Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: uint64(b.c.sizeMB+128) << 20, Network: unit.Loopback}})
		if err != nil {
			return fmt.Errorf("start %s: %w", id, err)
		}
		b.ids = append(b.ids, id)
		if r.Status != "running" {
			return fmt.Errorf("start %s: %+v", id, r)
		}
	}
	for _, id := range b.ids {
		if _, err := b.waitLines(id, "a verified line", func(ls []line) bool { return len(ls) > 0 && ls[len(ls)-1].VerifiedAt > 0 }); err != nil {
			return err
		}
	}
	b.atPark = map[string]parked{}
	return nil
}

// round parks every run at once, then resumes every run at once; kill
// (park, resume) has the daemon killed once half of those answered.
func (b *bench) round(ctx context.Context, r int, kill string) error {
	t0 := time.Now()
	cut, err := b.all(ctx, "park", kill == "park", func(cx context.Context, id string) error {
		t0 := time.Now()
		p, err := b.d.c.Park(cx, id)
		if err == nil && p.Run.Phase != "parked" {
			err = fmt.Errorf("parked %+v", p.Run)
		}
		if err == nil {
			b.step("park", time.Since(t0), p.DurationNS, p.Steps, nil)
			if ck := p.Checkpoint; ck != nil {
				b.parts("park criu", map[string]int64{"pause": ck.PauseNS, "dump": ck.DumpNS, "frozen": ck.FrozenNS, "mem write": ck.MemWriteNS, "ingest": ck.IngestNS})
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	if err := b.redo(ctx, cut, "parked", func(id string) error { _, err := b.d.c.Park(ctx, id); return err }); err != nil {
		return err
	}
	parkWall := time.Since(t0)
	for _, id := range b.ids {
		ls, err := b.output(id)
		if err != nil {
			return err
		}
		if len(ls) == 0 {
			return fmt.Errorf("%s: no line at its park", id)
		}
		b.atPark[id] = parked{lines: len(ls), last: ls[len(ls)-1]}
	}
	fmt.Println(label(r, "parks", parkWall, map[bool]string{true: "daemon killed"}[kill == "park"]))

	t0 = time.Now()
	cut, err = b.all(ctx, "resume", kill == "resume", func(cx context.Context, id string) error {
		t0 := time.Now()
		rs, err := b.d.c.Resume(cx, id)
		if err == nil && rs.Run.Status != "running" {
			err = fmt.Errorf("resumed %+v", rs.Run)
		}
		if err == nil {
			b.step("resume", time.Since(t0), rs.DurationNS, rs.Steps, rs.Restore)
		}
		return err
	})
	if err != nil {
		return err
	}
	if err := b.redo(ctx, cut, "executing", func(id string) error { _, err := b.d.c.Resume(ctx, id); return err }); err != nil {
		return err
	}
	resumeWall := time.Since(t0)
	for _, id := range b.ids {
		if err := b.checkResumed(ctx, id); err != nil {
			return err
		}
	}
	fmt.Println(label(r, "resumes", resumeWall, map[bool]string{true: "daemon killed"}[kill == "resume"]))
	return nil
}

// step keeps where one park or resume (op) that took took at the client
// spent its time: the daemon's steps, its restore's parts, and the wait
// outside the daemon's own time ns.
func (b *bench) step(op string, took time.Duration, ns int64, steps []api.Step, rs *api.Restore) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.steps[op+" wait"] = append(b.steps[op+" wait"], took-time.Duration(ns))
	for _, s := range steps {
		b.steps[op+" "+s.Name] = append(b.steps[op+" "+s.Name], time.Duration(s.NS))
	}
	if rs == nil {
		return
	}
	b.partsLocked(op+" criu", map[string]int64{"layout": rs.MaterializeNS, "rootfs": rs.RootfsNS, "task": rs.TaskNS, "forking": rs.ForkingNS, "restore": rs.RestoreNS, "total": rs.TotalNS})
}

// parts keeps the parts (ns) of one operation's step, named prefix.
func (b *bench) parts(prefix string, ns map[string]int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.partsLocked(prefix, ns)
}

func (b *bench) partsLocked(prefix string, ns map[string]int64) {
	for name, v := range ns {
		b.steps[prefix+" "+name] = append(b.steps[prefix+" "+name], time.Duration(v))
	}
}

// all runs op on every run at once and keeps the time of each that
// answered. With kill, the daemon is killed once half answered, and
// started again once every request has come back; it returns how many
// the kill cut short.
func (b *bench) all(ctx context.Context, name string, kill bool, op func(context.Context, string) error) (int, error) {
	type result struct {
		took time.Duration
		err  error
	}
	results := make([]result, len(b.ids))
	answered := make(chan struct{}, len(b.ids))
	var wg sync.WaitGroup
	for i, id := range b.ids {
		wg.Go(func() {
			cx, cancel := context.WithTimeout(ctx, opWait)
			defer cancel()
			t0 := time.Now()
			err := op(cx, id)
			results[i] = result{time.Since(t0), err}
			answered <- struct{}{}
		})
	}
	if kill {
		for range (len(b.ids) + 1) / 2 {
			<-answered
		}
		b.d.kill()
	}
	wg.Wait()
	cut := 0
	var errs []error
	for i, r := range results {
		switch {
		case r.err == nil:
			b.times[name] = append(b.times[name], r.took)
		case kill:
			cut++
		default:
			errs = append(errs, fmt.Errorf("%s %s: %w", name, b.ids[i], r.err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if kill {
		if err := b.d.start(ctx); err != nil {
			return 0, fmt.Errorf("the daemon's start after the kill: %w", err)
		}
	}
	return cut, nil
}

// redo brings every run to phase after a round the kill cut short: a
// run that is not there yet is done again with do, untimed.
func (b *bench) redo(ctx context.Context, cut int, phase string, do func(string) error) error {
	if cut == 0 {
		return nil
	}
	b.cut += cut
	for _, id := range b.ids {
		s, err := b.d.c.Show(ctx, id)
		if err != nil {
			return err
		}
		switch s.Run.Phase {
		case phase:
		case "parked", "executing":
			if err := do(id); err != nil {
				return fmt.Errorf("%s after the kill (was %s): %w", id, s.Run.Status, err)
			}
		default:
			return fmt.Errorf("%s after the kill: %+v", id, s.Run)
		}
	}
	return nil
}

// checkResumed waits until the oracle id, resumed, has hashed its buffer
// again and checks that it went on from its park as the same process:
// its lines since the park (after the last interval a kill may have
// lost) begin with the next counter, keep the park's pids, start time
// and checksum, each tick's file record, pipe echo and held TCP round
// trip (the pipe's echo is the tick before's), and no line reports a
// broken invariant. For a lazy resume it
// then keeps the time to every page resident.
func (b *bench) checkResumed(ctx context.Context, id string) error {
	at := b.atPark[id]
	var from int
	_, err := b.waitLines(id, "a line verified after the resume", func(ls []line) bool {
		from = -1
		for i := len(ls) - 1; i >= at.lines; i-- {
			if ls[i].Counter == at.last.Counter+1 {
				from = i
				break
			}
		}
		if from < 0 {
			return false
		}
		for _, l := range ls[from:] {
			if l.VerifiedAt > at.last.Counter {
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	ls, err := b.output(id)
	if err != nil {
		return err
	}
	a := at.last
	for i, l := range ls[from:] {
		switch {
		case l.Pid != a.Pid || l.ChildPid != a.ChildPid || l.StartTime != a.StartTime || l.Checksum != a.Checksum:
			return fmt.Errorf("%s: not the process parked: %+v after %+v", id, l, a)
		case l.Counter != a.Counter+uint64(i)+1:
			return fmt.Errorf("%s: counter %d, want %d", id, l.Counter, a.Counter+uint64(i)+1)
		case l.Verify != l.Checksum || l.VerifiedAt > l.Counter || !l.FileOK || l.FileOffset != 4096+8*int64(l.Counter) || l.PipeSeq != l.Counter-1:
			return fmt.Errorf("%s: memory, file or pipe state lost: %+v", id, l)
		case l.TCPHeld != l.Counter || l.TCPHeldPort != a.TCPHeldPort || l.TCPMPTCP || !l.LoUp:
			return fmt.Errorf("%s: TCP state lost: %+v after %+v", id, l, a)
		}
	}
	s, err := b.d.c.Show(ctx, id)
	if err != nil {
		return err
	}
	if s.Restore == nil || !s.Restore.Lazy {
		return nil
	}
	deadline := time.Now().Add(time.Minute)
	for s.Restore != nil && s.Restore.ResidentNS == 0 && s.Restore.PagesLost == "" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if s, err = b.d.c.Show(ctx, id); err != nil {
			return err
		}
	}
	switch {
	case s.Restore == nil || s.Restore.PagesLost != "":
		return fmt.Errorf("%s: lazy restore %+v", id, s.Restore)
	case s.Restore.ResidentNS > 0:
		b.times["resident"] = append(b.times["resident"], time.Duration(s.Restore.ResidentNS))
	default:
		return fmt.Errorf("%s: not every page resident a minute after its verification", id)
	}
	return nil
}

// output reads the complete lines of run id's output; a line reporting a
// broken invariant is an error.
func (b *bench) output(id string) ([]line, error) {
	data, err := os.ReadFile(filepath.Join(b.d.state, "runs", id, "stdout"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []line
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%s: oracle line %q: %w", id, sc.Bytes(), err)
		}
		if l.Error != "" {
			return nil, fmt.Errorf("%s: the oracle reports a broken invariant: %s", id, l.Error)
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// waitLines waits until run id's output satisfies ok, two minutes at
// most.
func (b *bench) waitLines(id, what string, ok func([]line) bool) ([]line, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ls, err := b.output(id)
		if err != nil {
			return nil, err
		}
		if ok(ls) {
			return ls, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: no %s within two minutes (%d lines)", id, what, len(ls))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// verifyAll verifies every run's record from genesis.
func (b *bench) verifyAll(ctx context.Context) error {
	for _, id := range b.ids {
		v, err := b.d.c.Verify(ctx, id)
		if err != nil {
			return fmt.Errorf("verify %s: %w", id, err)
		}
		if !v.OK {
			return fmt.Errorf("verify %s: %+v", id, v.Error)
		}
	}
	return nil
}

// closeAll closes every run the benchmark started.
func (b *bench) closeAll(ctx context.Context) error {
	var errs []error
	for _, id := range b.ids {
		if _, err := b.d.c.Close(ctx, id, "load test done"); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
