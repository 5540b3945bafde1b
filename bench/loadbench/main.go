// Command loadbench is issue 35's load test: N state oracles (units/oracle,
// SIZE MiB each, with their TCP state) run by one daemon of its own, parked
// together and resumed together for R rounds. Each park and each resume is
// timed at the client, from the request to the answer, so that time spent
// waiting in the daemon (an admission queue, a run's lock) counts. After
// each resume every oracle must go on as the same process with the same
// memory (its buffer's SHA-256 recomputed over the restored pages), file
// offset, pipe and held TCP connection; at the end every run's record
// must verify. With -kill, the daemon is killed with SIGKILL in the middle
// round, once half of that round's parks (or resumes) answered, and
// started again; what the kill cut short is done again, untimed.
//
// It prints each round, then the p50 and p99 (nearest rank) of each
// operation and the store's size after the last round.
//
// Usage (as root, from the module root; bench/load.sh wraps it):
//
//	loadbench -bin DIR/runrecordd -dir DIR -n 16 -size 64 -rounds 5 [-kill resume] [-- SERVE FLAGS]
package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	var c config
	flag.StringVar(&c.bin, "bin", "", "the runrecordd binary (runrecordd-gate beside it)")
	flag.StringVar(&c.dir, "dir", "", "a directory of the benchmark's own: the daemon's state, its log, the unit's archive")
	flag.IntVar(&c.n, "n", 16, "oracles")
	flag.IntVar(&c.sizeMB, "size", 64, "each oracle's buffer, MiB")
	flag.IntVar(&c.rounds, "rounds", 5, "rounds of parks then resumes")
	flag.StringVar(&c.kill, "kill", "", "kill the daemon with SIGKILL in the middle round, once half its parks (park) or resumes (resume) answered")
	flag.IntVar(&c.verifyEvery, "verify", 30, "the oracle's VERIFY_EVERY: a full hash of its buffer every this many 100 ms ticks")
	flag.Parse()
	c.serve = flag.Args()
	if c.bin == "" || c.dir == "" || c.n < 1 || c.sizeMB < 1 || c.rounds < 1 || !slices.Contains([]string{"", "park", "resume"}, c.kill) {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(1)
	}
}

// config is what the flags ask for.
type config struct {
	bin, dir    string
	n, sizeMB   int
	rounds      int
	kill        string
	verifyEvery int
	serve       []string // extra serve flags
}

func run(c config) (err error) {
	ctx := context.Background()
	d := &daemon{bin: c.bin, state: filepath.Join(c.dir, "state"), log: filepath.Join(c.dir, "daemon.log"), flags: c.serve}
	if err := d.start(ctx); err != nil {
		return err
	}
	defer func() {
		if serr := d.stop(); err == nil {
			err = serr
		}
	}()
	h, err := d.c.Host(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("load: %d oracles of %d MiB, %d rounds, kill %q, serve flags %q\n", c.n, c.sizeMB, c.rounds, c.kill, c.serve)
	fmt.Printf("criu: %s %s, off: %q\n", h.CRIU.Binary, h.CRIU.Version, h.CRIU.Off)
	b := &bench{c: c, d: d, times: map[string][]time.Duration{}, steps: map[string][]time.Duration{}}
	if err := b.startOracles(ctx); err != nil {
		return err
	}
	defer func() {
		if cerr := b.closeAll(ctx); err == nil {
			err = cerr
		}
	}()
	for r := range c.rounds {
		kill := ""
		if r == c.rounds/2 {
			kill = c.kill
		}
		if err := b.round(ctx, r, kill); err != nil {
			return fmt.Errorf("round %d: %w", r+1, err)
		}
	}
	store, err := duBytes(filepath.Join(d.state, "store"))
	if err != nil {
		return err
	}
	if err := b.verifyAll(ctx); err != nil {
		return err
	}
	b.report(store)
	return nil
}

// report prints the p50 and p99 of each operation and the store's size.
func (b *bench) report(store int64) {
	fmt.Printf("%-9s %5s %9s %9s %9s\n", "op", "n", "p50", "p99", "max")
	for _, op := range []string{"park", "resume", "resident"} {
		ts := b.times[op]
		if len(ts) == 0 {
			continue
		}
		slices.Sort(ts)
		fmt.Printf("%-9s %5d %9s %9s %9s\n", op, len(ts), rank(ts, 50).Round(time.Millisecond),
			rank(ts, 99).Round(time.Millisecond), ts[len(ts)-1].Round(time.Millisecond))
	}
	fmt.Println("where the time went (p50, p99):")
	for _, k := range slices.Sorted(maps.Keys(b.steps)) {
		ts := b.steps[k]
		slices.Sort(ts)
		fmt.Printf("  %-22s %9s %9s\n", k, rank(ts, 50).Round(time.Millisecond), rank(ts, 99).Round(time.Millisecond))
	}
	if b.cut > 0 {
		fmt.Printf("cut short by the kill and done again, untimed: %d\n", b.cut)
	}
	fmt.Printf("store: %.1f MB after the last round (%d bytes)\n", float64(store)/1e6, store)
	fmt.Printf("ok: every oracle kept its memory, file, pipe and TCP state after each resume; every run's record verified\n")
}

// rank is the p-th percentile of sorted ts, by nearest rank.
func rank(ts []time.Duration, p int) time.Duration {
	i := (p*len(ts)+99)/100 - 1
	return ts[max(i, 0)]
}

// duBytes is the bytes of the regular files under dir, each inode once.
func duBytes(dir string) (int64, error) {
	seen := map[uint64]bool{}
	var n int64
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if ino := inode(fi); ino != 0 {
			if seen[ino] {
				return nil
			}
			seen[ino] = true
		}
		n += fi.Size()
		return nil
	})
	return n, err
}

// label is a round's line: the wall time of its parks and resumes.
func label(r int, what string, wall time.Duration, extra string) string {
	s := fmt.Sprintf("round %d: %s %v", r+1, what, wall.Round(time.Millisecond))
	if extra != "" {
		s += " (" + strings.TrimSpace(extra) + ")"
	}
	return s
}

// inode is fi's inode number (0 when unknown).
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
