// Command lazybench measures issue 15's lazy image resume against today's
// eager one, side by side in one run, through the executor and the store
// exactly as the daemon's resume goes (docs/lazy-resume.md):
//
//   - a ballast unit (units/ballast, SIZE_MB MiB, every page private) is
//     started and parked: park.Image into a fresh store (CRIU dump with the
//     task frozen, both trees ingested as objects), the sandbox destroyed;
//   - the page cache is written back and dropped (as bench/park.sh does);
//   - resume: park.Offered (the rehash of every stored byte: the
//     snapshot's identity), park.Layout (hard links to the objects), then
//     executor Restore (eager) or RestoreLazy (lazy); the laid-out tree is
//     removed as soon as the restore returns, as the daemon does;
//   - the unit's next line must carry its old start time (it continued),
//     and its next full verification of every page must pass.
//
// Each round runs every mode once on a fresh unit, the order rotating. It
// prints each round and the medians: rehash, restore to running, resume to
// running (rehash + layout + restore), and for lazy the time until every
// page is resident (the lazy-pages daemon's exit) and the unit's RSS at
// running and at resident.
//
// With -kill D it instead runs one lazy resume, kills the lazy-pages
// daemon D after the unit runs, and reports what the unit does.
//
// Usage (as root, from the module root; bench/lazy.sh wraps it):
//
//	go run ./bench/lazybench -n 5 -size 512
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu/pageserver"

	"github.com/runrecordd/runrecordd/bench/benchhost"
	"github.com/runrecordd/runrecordd/internal/executor"
)

const cgroup = "/runrecordd-lazybench"

type bench struct {
	dir     string
	ex      *executor.Client
	unit    string // ballast or oracle
	address string // the containerd's, for the ctr mode
	archive string // the unit's OCI archive
	// ctrImported: the archive is imported into ctrNS.
	ctrImported bool
	sizeMB      int
	verify      int    // the ballast's VERIFY_EVERY
	logs        string // where to keep the CRIU logs of lazy restores ("": nowhere)
	results     map[string][]time.Duration
	rss         map[string][]int64
}

func main() {
	pageserver.MaybeRun()
	n := flag.Int("n", 5, "rounds")
	size := flag.Int("size", 512, "the unit's memory, MiB")
	unitName := flag.String("unit", "ballast", "the unit: ballast, or oracle (two processes, a held TCP connection over loopback, files, pipes)")
	modes := flag.String("modes", "eager,lazy", "modes, in the first round's order: eager, lazy, eager-cold, lazy-cold (no rehash), served (chunked images, lazy, each lazy chunk verified as the page server serves it), any of them with -noprefetch (the restore's programs not read ahead: executor.Client.Prefetch), ctr (ctr c restore --live --rw)")
	hold := flag.Bool("hold", false, "with -kill: hold copies of the daemon's userfaultfds across the kill")
	verify := flag.Int("verify", 8, "the ballast's VERIFY_EVERY: a full read of its memory every this many 250 ms ticks (1: at once after a restore, the worst case for lazy pages)")
	logs := flag.String("logs", "", "a directory to keep each lazy restore's CRIU logs in")
	kill := flag.Duration("kill", 0, "instead of rounds: one lazy resume whose lazy-pages daemon is killed this long after the unit runs")
	flag.Parse()
	c := config{unit: *unitName, n: *n, sizeMB: *size, verify: *verify, modes: strings.Split(*modes, ","), kill: *kill, hold: *hold, logs: *logs}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "lazybench:", err)
		os.Exit(1)
	}
}

// config is what the flags ask for.
type config struct {
	unit   string // ballast or oracle
	n      int    // rounds
	sizeMB int
	verify int      // the ballast's VERIFY_EVERY
	modes  []string // in the first round's order
	kill   time.Duration
	hold   bool
	logs   string
}

func run(c config) error {
	unitName, n, size, verify, modes := c.unit, c.n, c.sizeMB, c.verify, c.modes
	kill, hold, logs := c.kill, c.hold, c.logs
	ctx := context.Background()
	if unitName != "ballast" && unitName != "oracle" {
		return fmt.Errorf("no unit %q", unitName)
	}
	h, err := benchhost.Start(ctx, "rrlb-", cgroup, "/"+ctrNS)
	if err != nil {
		return err
	}
	defer h.Close()
	archive, err := h.ImportUnit(ctx, unitName, imageName(unitName))
	if err != nil {
		return err
	}
	dir, ex := h.Dir, h.Exec
	b := &bench{dir: dir, ex: ex, address: h.Address(), archive: archive, unit: unitName, sizeMB: size, verify: verify, logs: logs, results: map[string][]time.Duration{}, rss: map[string][]int64{}}
	if kill > 0 {
		return b.killRound(ctx, kill, hold)
	}
	fmt.Printf("lazybench: %d rounds, %d MiB %s (VERIFY_EVERY=%d), %s, %s\n", n, size, unitName, verify, time.Now().UTC().Format(time.RFC3339), versions(ctx, ex))
	for r := 1; r <= n; r++ {
		for k := range modes {
			m := modes[(r-1+k)%len(modes)]
			round := b.round
			if m == "ctr" {
				round = func(ctx context.Context, r int, _ string) error { return b.ctrRound(ctx, r) }
			}
			if err := round(ctx, r, m); err != nil {
				return fmt.Errorf("round %d %s: %w", r, m, err)
			}
		}
	}
	b.report(n, modes)
	return nil
}

func imageName(unit string) string { return "runrecordd.local/" + unit + ":1" }

func versions(ctx context.Context, ex *executor.Client) string {
	v, err := ex.Versions(ctx)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("containerd %s, runc %s, CRIU %s", v.Containerd, v.Runc, v.CRIU)
}

func (b *bench) add(key string, d time.Duration) { b.results[key] = append(b.results[key], d) }

func median(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)) }

func (b *bench) report(n int, modes []string) {
	cols := []string{"rehash", "layout", "rootfs", "task", "newtask", "criu", "restore", "resume", "resident", "pass", "cpu-lazy", "cpu-server"}
	fmt.Printf("\nmedians of %d (ms):\n%-10s", n, "mode")
	for _, c := range cols {
		fmt.Printf(" %8s", c)
	}
	fmt.Println()
	for _, m := range modes {
		if m == "ctr" {
			continue // its one figure is in the ratios below
		}
		fmt.Printf("%-10s", m)
		for _, c := range cols {
			fmt.Printf(" %8s", ms(median(b.results[m+" "+c])))
		}
		fmt.Println()
	}
	if c := median(b.results["ctr restore"]); c > 0 {
		b.ratios(c)
	}
	for _, m := range modes {
		if v := b.rss[m+" running"]; len(v) > 0 {
			fmt.Printf("%s RSS at running (KiB): %v; at resident: %v\n", m, v, b.rss[m+" resident"])
		}
	}
	fmt.Println("rehash: park.Offered (every stored byte hashed; skipped by -cold modes; served: park.OfferedServed, all but the lazy chunks);")
	fmt.Println("layout: park.Layout (hard links; served: park.LayoutServed, the eager chunks in a sparse pages file);")
	fmt.Println("restore: executor Restore/RestoreLazy to return (unit running), of which rootfs: the rw layer's apply,")
	fmt.Println("task: NewTask+Start (runc restore), of which newtask: NewTask; criu: CRIU's forking+restore times (stats-restore);")
	fmt.Println("resume: rehash+layout+restore; resident: from the restore's start until criu lazy-pages exited (every page in);")
	fmt.Println("pass: from the restore's start until the unit's first full read of its memory after it ended (its line's time)")
	fmt.Println("cpu-lazy, cpu-server: processor time (user+system) of criu lazy-pages and of the page server (served)")
}

// ratios prints the two ratios against ctr restore's median c:
// time to running, and time to every page resident, both from the resume's
// start (the rehash included) and per round.
func (b *bench) ratios(c time.Duration) {
	fmt.Printf("ctr restore median %s ms (ctr c restore --live --rw, in this run)\n", ms(c))
	for _, m := range []string{"eager", "lazy", "eager-cold", "lazy-cold", "served", "served" + noPrefetch} {
		resume, rehash, resident := b.results[m+" resume"], b.results[m+" rehash"], b.results[m+" resident"]
		if len(resume) == 0 {
			continue
		}
		all := resume // eager: every page is in at running
		if len(resident) == len(rehash) {
			all = nil
			for i := range resident {
				all = append(all, rehash[i]+resident[i])
			}
		}
		fmt.Printf("%-10s to running / ctr %.2f (target <= 0.15), restore alone %.2f; every page resident / ctr %.2f (target <= 0.6)\n", m,
			float64(median(resume))/float64(c), float64(median(b.results[m+" restore"]))/float64(c), float64(median(all))/float64(c))
	}
}
