package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// links are this host's sandboxes' links out (internal/egress), where the
// host grants egress (Config.EgressAllow). A run granted network egress
// holds a slot from its first sandbox here until it closes or leaves;
// the slot is kept in a file, StateDir/egress/N holding the run's id, so
// a restarted daemon knows which links, rules and tracked connections
// are owned (sweep). Between its sandboxes (a park here) the run keeps
// its rules, its address translation and its tracked connections; the
// outside's packets for it are dropped until it resumes.
type links struct {
	gw  *egress.Gateway
	dir string
	// ceiling is the host's egress ceiling, judged at every link: a run
	// granted more under a wider one (before a restart, or before it
	// left and came back, when an import does not judge its grants
	// again) is not linked out beyond the ceiling now.
	ceiling []netip.Prefix
	log     *slog.Logger
	mu      sync.Mutex
	slot    map[string]int         // run → slot, as the files say
	runs    map[string]*egress.Run // the runs this process holds a handle of

	// names: the host resolves names for its runs, so a grant may name
	// destinations; dns answers the runs' queries (names.go).
	names bool
	dns   *egress.DNSServer
}

// openLinks sets the host up for egress, under ceiling, and reads the
// slots held.
func openLinks(stateDir string, ceiling []netip.Prefix, log *slog.Logger) (*links, error) {
	dir := filepath.Join(stateDir, "egress")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	gw, err := egress.Open(egress.Config{})
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	l := &links{gw: gw, dir: dir, ceiling: ceiling, log: log, slot: map[string]int{}, runs: map[string]*egress.Run{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		gw.Close()
		return nil, err
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		slot, err := strconv.Atoi(e.Name())
		b, rerr := os.ReadFile(p)
		run := strings.TrimSpace(string(b))
		if err != nil || slot < 1 || slot > gw.Slots() || rerr != nil || run == "" {
			// A temporary file a crash left, or not a slot's.
			log.Warn("egress: removing a file that holds no slot", "file", p)
			os.Remove(p)
			continue
		}
		l.slot[run] = slot
	}
	return l, nil
}

func (l *links) close() error { return errors.Join(l.closeNames(), l.gw.Close()) }

// Link holds a slot for run (taking one if it holds none) and returns
// how to link a sandbox of it out under allow, which must lie within the
// ceiling (bundle.CheckEgress).
func (l *links) Link(run string, allow []unit.Dest) (func(netns string) error, error) {
	if err := bundle.CheckEgress(unit.Grants{Network: unit.Egress, Egress: allow}, l.ceiling, l.names); err != nil {
		return nil, fmt.Errorf("run %s: %w", run, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.runs[run]; r != nil {
		return r.Attach, nil
	}
	var r *egress.Run
	slot, held := l.slot[run]
	if held {
		// Its policy was installed by this host: kept while parked.
		var err error
		if r, err = l.gw.Adopt(slot, allow); err != nil {
			return nil, err
		}
	} else {
		var err error
		if slot, err = l.take(run); err != nil {
			return nil, err
		}
		if r, err = l.gw.Allow(slot, allow); err != nil {
			l.free(run, slot)
			return nil, err
		}
	}
	l.runs[run] = r
	return r.Attach, nil
}

// Unlink removes run's link from its sandbox (a park): its rules, its
// translation and its tracked connections stay. A run holding no slot
// has nothing to remove.
func (l *links) Unlink(run string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.runs[run]
	if r == nil {
		slot, held := l.slot[run]
		if !held {
			return nil
		}
		var err error
		if r, err = l.gw.Adopt(slot, nil); err != nil { // Detach needs no policy
			return err
		}
	}
	return r.Detach()
}

// Pass lets the outside's packets reach run's sandbox, linked again
// after a park (egress.Run.Pass). A run without a link here has none to
// pass.
func (l *links) Pass(run string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.runs[run]; r != nil {
		return r.Pass()
	}
	return nil
}

// Counters is run's egress counters on this host (interval.Traffic):
// false when it holds no slot here; zero when its rules are gone (the
// host restarted since they were installed).
func (l *links) Counters(run string) (interval.Counters, bool, error) {
	l.mu.Lock()
	slot, held := l.slot[run]
	l.mu.Unlock()
	if !held {
		return interval.Counters{}, false, nil
	}
	c, _, err := l.gw.Counters(slot)
	if err != nil {
		return interval.Counters{}, false, err
	}
	return interval.Counters{InBytes: c.InBytes, InPackets: c.InPackets, OutBytes: c.OutBytes, OutPackets: c.OutPackets}, true, nil
}

// take takes a free slot for run and writes its file.
func (l *links) take(run string) (int, error) {
	used := map[int]bool{}
	for _, s := range l.slot {
		used[s] = true
	}
	for s := 1; s <= l.gw.Slots(); s++ {
		if used[s] {
			continue
		}
		err := atomicfile.Create(filepath.Join(l.dir, strconv.Itoa(s)), 0o600, func(f *os.File) error {
			_, err := f.WriteString(run + "\n")
			return err
		})
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("egress: slot for run %s: %w", run, err)
		}
		l.slot[run] = s
		return s, nil
	}
	return 0, fmt.Errorf("run %s: %w: all %d slots are held", run, egress.ErrFull, l.gw.Slots())
}

// free forgets run's slot and removes its file.
func (l *links) free(run string, slot int) {
	delete(l.slot, run)
	delete(l.runs, run)
	if err := os.Remove(filepath.Join(l.dir, strconv.Itoa(slot))); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.log.Error("egress: slot file not removed", "run", run, "slot", slot, "err", err)
	}
}

// Release removes run's link, rules and tracked connections, and frees
// its slot: it closed or left. A run holding none is not an error. What
// cannot be removed is logged, and the slot stays held until the next
// start's sweep.
func (l *links) Release(run string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	slot, held := l.slot[run]
	if !held {
		return
	}
	r := l.runs[run]
	if r == nil {
		var err error
		if r, err = l.gw.Adopt(slot, nil); err != nil {
			l.log.Error("egress: link not removed", "run", run, "slot", slot, "err", err)
			return
		}
	}
	if err := r.Close(); err != nil {
		l.log.Error("egress: link not removed; the next start retries", "run", run, "slot", slot, "err", err)
		delete(l.runs, run)
		return
	}
	l.free(run, slot)
}

// sweep, at a start before any sandbox is linked, frees the slots of
// runs that no longer need one here (st says: closed, unknown, or handed
// to another host), then removes every link, rule and tracked connection
// of a slot no run holds: what a crash left.
func (l *links) sweep(st *store.Store) error {
	held := map[string]int{}
	l.mu.Lock()
	for run, s := range l.slot {
		held[run] = s
	}
	l.mu.Unlock()
	for run := range held {
		r, err := st.Run(run)
		gone := errors.Is(err, store.ErrNoRun) || (err == nil && r.Phase == record.PhaseClosed)
		if err == nil && !gone {
			_, gone, err = st.HandedOff(run)
		}
		if err != nil && !errors.Is(err, store.ErrNoRun) {
			l.log.Warn("reconcile: the egress slot of a run not read; kept", "run", run, "err", err)
			continue
		}
		if gone {
			l.Release(run)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	owned := map[int]bool{}
	for _, s := range l.slot {
		owned[s] = true
	}
	return l.gw.Reconcile(func(s int) bool { return owned[s] })
}
