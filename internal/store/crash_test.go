package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// The crash test re-executes the test binary as a writer (TestMain sees
// crashChildEnv) and kills it with SIGKILL at pseudo-random points.
const crashChildEnv = "RUNRECORDD_STORE_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		seed, _ := strconv.ParseInt(os.Getenv(crashChildEnv+"_SEED"), 10, 64)
		crashChild(dir, seed)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashChild writes until it is killed: four goroutines, each appending
// to its own runs in the daemon's order — objects first, durable, then the
// segment naming them — with executed intervals, image parks (a staged
// tree ingested as a directory object), transcript parks (a streamed
// object), resumes and closes; and a garbage collection now and then.
// It prints "open" before it opens the store and "ready" once it has; after
// each acknowledged append it prints "A <run> <len> <head>", so the parent
// can kill it on these events and check that nothing acknowledged was lost.
func crashChild(dir string, seed int64) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(3)
	}
	var out sync.Mutex
	report := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	report("open")
	s, err := Open(dir)
	if err != nil {
		fail(err)
	}
	report("ready")
	live := map[string]bool{}
	for _, p := range []record.Phase{record.PhaseExecuting, record.PhaseParked} {
		ids, err := s.Runs(p)
		if err != nil {
			fail(err)
		}
		for _, id := range ids {
			live[id] = true
		}
	}
	const workers, runsEach = 4, 4
	pools := make([][]string, workers)
	w := 0
	for id := range live {
		if len(pools[w%workers]) < runsEach {
			pools[w%workers] = append(pools[w%workers], id)
		}
		w++
	}
	var wg sync.WaitGroup
	for w := range workers {
		rng := rand.New(rand.NewSource(seed*workers + int64(w)))
		wg.Go(func() {
			pool := pools[w]
			for i := 0; ; i++ {
				for len(pool) < runsEach {
					id := fmt.Sprintf("run-%d-%d-%d", seed, w, i)
					if _, err := s.Create(id, record.Sum([]byte(id)), record.Sum([]byte("grants"))); err != nil {
						fail(err)
					}
					pool = append(pool, id)
					i++
				}
				k := rng.Intn(len(pool))
				run, err := s.Run(pool[k])
				if err != nil {
					fail(err)
				}
				seg, err := crashSegment(s, rng, run, fmt.Sprintf("%d-%d-%d", seed, w, i))
				if err != nil {
					fail(err)
				}
				h, err := s.Append(run.ID, run.Head, seg)
				switch {
				case errors.Is(err, ErrMissingObject): // collected before it was named
					continue
				case err != nil:
					fail(err)
				}
				report("A %s %d %s", run.ID, run.Len+1, h)
				if seg.Kind == record.Closed {
					pool = append(pool[:k], pool[k+1:]...)
				}
				if w == 0 && i%40 == 39 {
					if _, err := s.GC(context.Background(), 0); err != nil {
						fail(err)
					}
				}
			}
		})
	}
	wg.Wait()
}

// crashSegment puts the objects for run's next segment and returns it.
func crashSegment(s *Store, rng *rand.Rand, run Run, tag string) (record.Segment, error) {
	switch run.Phase {
	case record.PhaseParked:
		if rng.Intn(8) == 0 {
			return record.Closure("done " + tag), nil
		}
		return record.Resumption(run.Parked, uint64(rng.Intn(1000)+1), record.Estimated), nil
	case record.PhaseClosed:
		return record.Segment{}, fmt.Errorf("run %s: closed run in a pool", run.ID)
	}
	att, err := crashAttestation(s, rng, tag)
	if err != nil {
		return record.Segment{}, err
	}
	draw := rng.Intn(4)
	if run.Last != record.Executed {
		draw = 2 // a park ends an executed interval
	}
	switch draw {
	case 0: // image park
		stage, err := s.StagingDir("criu")
		if err != nil {
			return record.Segment{}, err
		}
		for f := range 1 + rng.Intn(4) {
			body := bytes.Repeat([]byte(tag+" "), 1+rng.Intn(4000))
			if err := os.WriteFile(filepath.Join(stage, fmt.Sprintf("pages-%d.img", f)), body, 0o600); err != nil {
				return record.Segment{}, err
			}
		}
		// The same core image in many parks: ingest dedupes it.
		if err := os.WriteFile(filepath.Join(stage, "core.img"), []byte("core"), 0o600); err != nil {
			return record.Segment{}, err
		}
		root, _, err := s.Ingest(context.Background(), stage)
		if err != nil {
			return record.Segment{}, err
		}
		mem, err := s.Put(context.Background(), io.LimitReader(rng, int64(rng.Intn(256<<10))))
		if err != nil {
			return record.Segment{}, err
		}
		man, err := s.PutBytes([]byte("manifest image"))
		if err != nil {
			return record.Segment{}, err
		}
		return record.Suspension(record.ImageSnapshot(root, &mem), man), nil
	case 1: // transcript park
		tr, err := s.Put(context.Background(), io.LimitReader(rng, int64(rng.Intn(512<<10))))
		if err != nil {
			return record.Segment{}, err
		}
		man, err := s.PutBytes([]byte("manifest transcript"))
		if err != nil {
			return record.Segment{}, err
		}
		return record.Suspension(record.TranscriptSnapshot(tr), man), nil
	}
	return record.Execution(att, &record.CallAccount{Dispatched: []string{"call-" + tag}}), nil
}

// crashAttestation stores an attestation and its receipt and journal:
// put one by one, or, one time in two, staged and adopted together
// (AdoptFiles, as a fetch from a peer adopts).
func crashAttestation(s *Store, rng *rand.Rand, tag string) (record.Address, error) {
	receipt, journal := []byte("receipt "+tag), []byte("journal "+tag)
	refs := []record.Address{record.Sum(receipt), record.Sum(journal)}
	att := []byte("attestation " + tag)
	if rng.Intn(2) == 0 {
		if _, err := s.PutBytes(receipt); err != nil {
			return record.Address{}, err
		}
		if _, err := s.PutBytes(journal); err != nil {
			return record.Address{}, err
		}
		return s.PutBytes(att, refs...)
	}
	dir, err := s.StagingDir("fetch")
	if err != nil {
		return record.Address{}, err
	}
	as := []Adoption{{Address: refs[0]}, {Address: refs[1]}, {Address: record.Sum(att), Refs: refs}}
	for i, b := range [][]byte{receipt, journal, att} {
		as[i].Path = filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(as[i].Path, b, 0o600); err != nil {
			return record.Address{}, err
		}
	}
	if err := s.AdoptFiles(context.Background(), as); err != nil {
		return record.Address{}, err
	}
	return as[2].Address, os.RemoveAll(dir)
}

// TestCrashSIGKILL kills the writer on events, not after a sleep, so that
// every kill does the work it was drawn to do however slow the machine:
// one kill in eight comes when the child says it is opening the store (tmp
// cleanup, syncfs, migration), after a delay of 0-14 ms; the rest once it
// has acknowledged 0-4 appends, after a further 0-4 ms, so they land in the
// middle of its four writers' next appends.
func TestCrashSIGKILL(t *testing.T) {
	kills := 200
	if testing.Short() {
		kills = 20
	}
	const maxAcks, openDelay, extraDelay = 4, 15, 5
	dir := t.TempDir()
	rng := rand.New(rand.NewSource(20261202))
	acked := map[string]string{} // run → "len head" of its last acknowledged append
	prevSegs := 0
	totalAcks := 0 // acknowledged appends over all kills
	duringOpen := 0
	var cs CheckStats
	known := rehashed{stamps: map[record.Address]fileStamp{}}
	start := time.Now()
	for k := range kills {
		// The schedule is drawn in the same order whatever the child does.
		atOpen := k%8 == 0
		want := rng.Intn(maxAcks + 1)
		delay := time.Duration(rng.Intn(extraDelay)) * time.Millisecond
		if atOpen {
			want = 0
			delay = time.Duration(rng.Intn(openDelay)) * time.Millisecond
		}

		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprintf("%s_SEED=%d", crashChildEnv, k))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The reader drains stdout until the child is gone, so the child
		// never blocks on a full pipe for long; lines wait in the channel
		// until the parent takes them.
		lines := make(chan string, 256)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			io.Copy(io.Discard, stdout)
		}()
		var got []string
		opened, ready, acks := false, false, 0
		take := func(l string) {
			got = append(got, l)
			switch {
			case l == "open":
				opened = true
			case l == "ready":
				ready = true
			case strings.HasPrefix(l, "A "):
				acks++
			}
		}
		// finish kills the child if it still runs, takes the rest of its
		// output and reaps it.
		finish := func() {
			cmd.Process.Signal(syscall.SIGKILL)
			for l := range lines {
				take(l)
			}
			cmd.Wait()
		}
		reached := func() bool {
			if atOpen {
				return opened
			}
			return ready && acks >= want
		}
		deadline := time.NewTimer(2 * time.Minute)
		for !reached() {
			select {
			case l, ok := <-lines:
				if !ok {
					finish()
					t.Fatalf("kill %d: the child ended after %d of %d acknowledged appends (ready %v): %v: %s",
						k, acks, want, ready, cmd.ProcessState, stderr.String())
				}
				take(l)
			case <-deadline.C:
				finish()
				t.Fatalf("kill %d: the child acknowledged %d of %d appends in 2m (ready %v): %s",
					k, acks, want, ready, stderr.String())
			}
		}
		deadline.Stop()
		time.Sleep(delay)
		finish()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("kill %d: the child ended on its own: %v: %s", k, cmd.ProcessState, stderr.String())
		}
		if !ready {
			duringOpen++
		}
		totalAcks += acks
		for _, l := range got {
			f := strings.Fields(l)
			if len(f) == 4 && f[0] == "A" {
				acked[f[1]] = f[2] + " " + f[3]
			}
		}

		s, err := Open(dir)
		if err != nil {
			t.Fatalf("after kill %d: open: %v", k, err)
		}
		// After every twentieth kill (the last one too) the whole fsck;
		// after the others the same fsck, but rehashing only the objects
		// whose files are new or changed since they last rehashed well
		// (rehashed.unchanged): rehashing all after each kill made the
		// test's time grow with the square of the kills.
		if k%20 == 19 {
			cs, err = s.Check(t.Context())
		} else {
			cs, err = s.check(t.Context(), known.unchanged(s))
		}
		if err != nil {
			s.Close()
			t.Fatalf("after kill %d: %v", k, err)
		}
		if cs.Segments < prevSegs {
			t.Fatalf("after kill %d: %d segments, %d before: a committed segment was lost", k, cs.Segments, prevSegs)
		}
		prevSegs = cs.Segments
		// Every acknowledged append is in its record.
		for run, lh := range acked {
			var n int
			var head string
			fmt.Sscan(lh, &n, &head)
			r, err := s.Record(run)
			if err != nil || r.Len() < n || r.HeadAt(n-1).String() != head {
				s.Close()
				t.Fatalf("after kill %d: run %s: acknowledged segment %d (%s) not in the record: %v", k, run, n, head, err)
			}
		}
		if tmp, _ := os.ReadDir(filepath.Join(dir, "objects", "tmp")); len(tmp) != 0 {
			t.Fatalf("after kill %d: open left %d entries in objects/tmp", k, len(tmp))
		}
		s.Close()
	}
	// Each acknowledged append is a distinct segment (a run and a length),
	// and runs are never removed, so the store holds at least as many
	// segments as appends were acknowledged. The kills wait for their
	// appends, so on any machine the count is the schedule's (about
	// maxAcks/2 per kill), not a matter of timing.
	if prevSegs < totalAcks {
		t.Fatalf("%d segments, but %d appends were acknowledged", prevSegs, totalAcks)
	}
	if totalAcks < kills {
		t.Fatalf("only %d acknowledged appends over %d kills: the kills came before the work", totalAcks, kills)
	}
	fmt.Printf("crash test: survived %d kills (%d before the store was open; %d appends acknowledged; %d runs, %d segments, %d reachable objects of %d MiB checked after each, %d rehashes; %d acknowledged runs checked; %s)\n",
		kills, duringOpen, totalAcks, cs.Runs, cs.Segments, cs.Objects, cs.Bytes>>20, known.rehashes, len(acked), time.Since(start).Round(time.Second))
}

// rehashed remembers, for each object the crash test's check rehashed,
// the stamp of its file then.
//
// A file's content cannot change while its stamp stays the same: a write
// moves its mtime and ctime, a rename over it changes its inode, and
// nothing in user space sets a ctime. So an object whose file has the
// stamp it had when it rehashed well still does; the crash test rehashes
// only the others after each kill, and the quadratic cost of rehashing
// every object after every kill (70% of the test's time) goes.
type rehashed struct {
	mu       sync.Mutex
	stamps   map[record.Address]fileStamp
	rehashes int // objects the incremental checks rehashed
}

// fileStamp is what changes when a file's content may have.
type fileStamp struct {
	dev, ino   uint64
	size       int64
	mtim, ctim syscall.Timespec
}

// unchanged is [Store.check]'s verified for s: true for an object whose
// file is stamped as when it was last rehashed. It records the stamp of
// every other, before the check rehashes it (a failed rehash fails the test).
func (r *rehashed) unchanged(s *Store) func(record.Address) bool {
	return func(a record.Address) bool {
		var st syscall.Stat_t
		if err := syscall.Stat(s.Path(a), &st); err != nil {
			return false // the check's rehash says what is wrong
		}
		fs := fileStamp{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtim: st.Mtim, ctim: st.Ctim}
		r.mu.Lock()
		defer r.mu.Unlock()
		if old, ok := r.stamps[a]; ok && old == fs {
			return true
		}
		r.stamps[a] = fs
		r.rehashes++
		return false
	}
}

// TestCheckRehashesChanged: the crash test's incremental check skips the
// objects it rehashed before whose files are unchanged, and rehashes — so
// finds corrupt — one rewritten in place, even with its mtime set back.
func TestCheckRehashesChanged(t *testing.T) {
	s := mustStore(t)
	att := put(t, s, "attestation")
	h := mustCreate(t, s, "r")
	mustAppend(t, s, "r", h, record.Execution(att, &record.CallAccount{Dispatched: []string{"x"}}))
	known := rehashed{stamps: map[record.Address]fileStamp{}}
	cs, err := s.check(t.Context(), known.unchanged(s))
	if err != nil || known.rehashes != cs.Objects || cs.Objects == 0 {
		t.Fatalf("first check: %+v, %v; %d rehashed", cs, err, known.rehashes)
	}
	if cs, err = s.check(t.Context(), known.unchanged(s)); err != nil || known.rehashes != cs.Objects {
		t.Fatalf("second check: %+v, %v; %d rehashed in all, want none again", cs, err, known.rehashes)
	}
	info, err := os.Stat(s.Path(att))
	if err != nil {
		t.Fatal(err)
	}
	damage(t, s, att, flipByte(0))
	if err := chtimes(s.Path(att), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.check(t.Context(), known.unchanged(s)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("check after the object was rewritten in place: %v, want ErrCorrupt", err)
	}
	damage(t, s, att, flipByte(0)) // repaired, for the cleanup's check
}
