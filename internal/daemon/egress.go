package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/interval"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
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
// outside's packets for it are dropped until it resumes, for at most the
// park hold: then its tracked connections are removed (egress.Gateway.
// Forget). The park's instant is the slot file's second line, "parked
// UNIX-NS", so the hold counts across restarts.
//
// A restore's connections to outside are journaled (a closed entry,
// Closing) then closed at its Pass, where the host holds no state of
// them: a slot taken for the restore (the run was parked on another
// host, or left this one and came back), rules gone (the host
// restarted), or a park older than the hold. Otherwise they go on. A
// restore the last daemon did not pass is passed at the start (Reheld).
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

	// hold is how long a park keeps a run's tracked connections;
	// parked is when each run parked here still was (the files' second
	// line), timers end their holds, and restoring is the runs whose
	// restore is under way (their hold does not end meanwhile).
	hold      time.Duration
	parked    map[string]time.Time
	timers    map[string]*time.Timer
	restoring map[string]bool
	// forget removes a slot's tracked connections (gw.Forget).
	forget func(slot int) error
}

// DefaultParkHold is how long a park keeps a run's tracked connections
// to outside by default (serve --egress-park-hold): Linux's default
// keepalive time. A peer that probes an idle connection gives up on an
// unanswered one after 2 h 11 min, one with data in flight after about
// 15 min; few connections held longer are still alive at the peer.
const DefaultParkHold = 2 * time.Hour

// EgressLinks is how this host links runs out, beyond its ceiling: the
// pool of the runs' addresses and their links' name prefix
// (egress.Config; serve --egress-pool, --egress-link-prefix) and the
// park hold (--egress-park-hold; DefaultParkHold when zero). Two daemons
// in one network namespace need pools and prefixes apart.
type EgressLinks struct {
	Pool       netip.Prefix
	LinkPrefix string
	ParkHold   time.Duration
}

// openLinks sets the host up for egress, under ceiling, and reads the
// slots held.
func openLinks(stateDir string, ceiling []netip.Prefix, set EgressLinks, log *slog.Logger) (*links, error) {
	dir := filepath.Join(stateDir, "egress")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	gw, err := egress.Open(egress.Config{Pool: set.Pool, LinkPrefix: set.LinkPrefix})
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	l, err := loadLinks(gw, dir, ceiling, set.ParkHold, log)
	if err != nil {
		gw.Close()
		return nil, err
	}
	return l, nil
}

// loadLinks reads the slots held in dir, for gw, and starts the holds of
// the runs parked.
func loadLinks(gw *egress.Gateway, dir string, ceiling []netip.Prefix, hold time.Duration, log *slog.Logger) (*links, error) {
	if hold <= 0 {
		hold = DefaultParkHold
	}
	l := &links{gw: gw, dir: dir, ceiling: ceiling, log: log, slot: map[string]int{}, runs: map[string]*egress.Run{},
		hold: hold, parked: map[string]time.Time{}, timers: map[string]*time.Timer{}, restoring: map[string]bool{}, forget: gw.Forget}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	// A hold already over fires at once: its expire waits for the lock
	// until arm has put its timer in place.
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		slot, err := strconv.Atoi(e.Name())
		b, rerr := os.ReadFile(p)
		run, rest, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if err != nil || slot < 1 || slot > gw.Slots() || rerr != nil || run == "" {
			// A temporary file a crash left, or not a slot's.
			log.Warn("egress: removing a file that holds no slot", "file", p)
			os.Remove(p)
			continue
		}
		l.slot[run] = slot
		if ns, ok := strings.CutPrefix(rest, "parked "); ok {
			if n, err := strconv.ParseInt(ns, 10, 64); err == nil {
				l.parked[run] = time.Unix(0, n)
				l.arm(run)
			}
		}
	}
	return l, nil
}

func (l *links) close() error {
	l.mu.Lock()
	for run, t := range l.timers {
		t.Stop()
		delete(l.timers, run)
	}
	l.mu.Unlock()
	return errors.Join(l.closeNames(), l.gw.Close())
}

// arm starts run's hold, parked at l.parked[run] (l.mu held).
func (l *links) arm(run string) {
	if t := l.timers[run]; t != nil {
		t.Stop()
	}
	at := l.parked[run]
	l.timers[run] = time.AfterFunc(time.Until(at.Add(l.hold)), func() { l.expire(run, at) })
}

// expire ends the hold of run, parked at at: its tracked connections
// are removed. A run resumed or parked again since has a hold of its
// own; one whose restore is under way is looked at again in a minute.
func (l *links) expire(run string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slot, held := l.slot[run]
	if !held || !l.parked[run].Equal(at) || l.timers[run] == nil {
		return
	}
	if l.restoring[run] {
		l.timers[run] = time.AfterFunc(time.Minute, func() { l.expire(run, at) })
		return
	}
	delete(l.timers, run)
	if err := l.forget(slot); err != nil {
		l.log.Error("egress: a parked run's tracked connections not removed at its hold's end", "run", run, "slot", slot, "err", err)
		return
	}
	l.log.Info("egress: a parked run's hold ended: its connections to outside are closed at its resume", "run", run, "slot", slot, "parked", at)
}

// unpark forgets run's park here: its hold, and the slot file's park
// line (l.mu held). A file not written back is logged: the next start
// counts the hold from the park still.
func (l *links) unpark(run string) {
	if t := l.timers[run]; t != nil {
		t.Stop()
		delete(l.timers, run)
	}
	delete(l.restoring, run)
	if _, ok := l.parked[run]; !ok {
		return
	}
	delete(l.parked, run)
	if slot, held := l.slot[run]; held {
		if err := l.writeSlot(run, slot, ""); err != nil {
			l.log.Warn("egress: slot file not written", "run", run, "slot", slot, "err", err)
		}
	}
}

// writeSlot writes run slot's file, its run's id and line (if any). The
// swap is atomic, not synced: after a power loss the host's tracked
// connections are gone anyway (the rules too: the restore closes the
// run's connections).
func (l *links) writeSlot(run string, slot int, line string) error {
	return atomicfile.WriteNoSync(filepath.Join(l.dir, strconv.Itoa(slot)), 0o600, func(f *os.File) error {
		_, err := f.WriteString(run + "\n" + line)
		return err
	})
}

// resetFor is why a restore of run, holding its slot here (fresh: taken
// for it now), closes its connections to outside at its Pass (l.mu
// held): egress.Elsewhere for a fresh slot, egress.Expired for a park
// older than the hold, whose tracked connections are removed now if
// its timer has not yet, egress.Keep otherwise.
func (l *links) resetFor(run string, fresh bool, now time.Time) egress.Reset {
	if fresh {
		return egress.Elsewhere
	}
	at, parked := l.parked[run]
	if !parked || now.Sub(at) < l.hold {
		return egress.Keep
	}
	if t := l.timers[run]; t != nil {
		t.Stop()
		delete(l.timers, run)
		if err := l.forget(l.slot[run]); err != nil {
			l.log.Error("egress: a parked run's tracked connections not removed at its hold's end", "run", run, "err", err)
		}
	}
	return egress.Expired
}

// Link holds a slot for run (taking one if it holds none) and returns
// how to link a sandbox of it out under allow, which must lie within the
// ceiling (bundle.CheckEgress). For a restore the link holds the
// outside's packets until Pass, which first closes the run's
// connections to outside where this host holds no state of them
// (resetFor), once Closing journaled them. Otherwise (a start, or a unit going on after a park was
// refused) the run's park here, if any, is over.
func (l *links) Link(run string, allow []unit.Dest, restore bool) (func(netns string) error, error) {
	if err := bundle.CheckEgress(unit.Grants{Network: unit.Egress, Egress: allow}, l.ceiling, l.names); err != nil {
		return nil, fmt.Errorf("run %s: %w", run, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, held := l.slot[run]
	r, err := l.runOf(run, allow)
	if err != nil {
		return nil, err
	}
	if restore {
		r.Restore(l.resetFor(run, !held, time.Now()))
		l.restoring[run] = true
	} else {
		l.unpark(run)
	}
	return r.Attach, nil
}

// runOf is run's handle, made if this process has none: adopted if run
// holds a slot, its policy installed in a slot taken now otherwise
// (l.mu held).
func (l *links) runOf(run string, allow []unit.Dest) (*egress.Run, error) {
	if r := l.runs[run]; r != nil {
		return r, nil
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
	return r, nil
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
	if err := r.Detach(); err != nil {
		return err
	}
	l.unpark(run)
	now := time.Now()
	if err := l.writeSlot(run, l.slot[run], "parked "+strconv.FormatInt(now.UnixNano(), 10)+"\n"); err != nil {
		// The hold counts in this process all the same.
		l.log.Warn("egress: the park's instant not written to its slot file", "run", run, "err", err)
	}
	l.parked[run] = now
	l.arm(run)
	return nil
}

// Closing journals, through journal, the closed entry of the
// connections to outside run's next Pass closes (egress.Run.ToClose),
// if it closes any: a restore where this host holds no state of them
// (Link). The caller makes the entry durable in the run's open interval
// before it returns (docs/unit.md, egress): not listed, or not
// journaled, none is closed, and the Pass lets the outside's packets
// through to them as they are (an error says so). Its run's lock held,
// nothing else lists or closes them meanwhile.
func (l *links) Closing(run string, journal func(attest.Entry) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.runs[run]
	if r == nil {
		return nil
	}
	closed, err := r.ToClose()
	if err == nil && closed.Why != egress.Keep {
		var e attest.Entry
		if e, err = closedEntry(closed, time.Now().UnixNano()); err == nil {
			err = journal(e)
		}
	}
	if err != nil {
		r.Restore(egress.Keep)
		return fmt.Errorf("run %s: none of its connections to outside closed: %w", run, err)
	}
	return nil
}

// closedEntry is the closed entry of c.
func closedEntry(c egress.Closed, atNS int64) (attest.Entry, error) {
	e := attest.Closed{Reason: attest.ClosedElsewhere, Total: uint32(len(c.Conns))}
	if c.Why == egress.Expired {
		e.Reason = attest.ClosedExpired
	}
	for _, cn := range c.Conns[:min(len(c.Conns), attest.MaxClosedConns)] {
		e.Conns = append(e.Conns, attest.ClosedConn{Local: cn.Local, Remote: cn.Remote})
	}
	return e.Entry(atNS)
}

// Pass lets the outside's packets reach run's sandbox, linked again
// after a park (egress.Run.Pass), once Closing journaled what it closes
// first: its park here is over. An error says some were not closed, and
// the packets pass all the same. A run without a link here has none to
// pass.
func (l *links) Pass(run string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.runs[run]
	if r == nil {
		return nil
	}
	closed, err := r.Pass()
	l.unpark(run)
	if closed.Why != egress.Keep {
		l.log.Info("egress: a restore closed its connections to outside", "run", run, "reason", closed.Why, "closed", len(closed.Conns))
	}
	return err
}

// Reheld completes, after a restart, the pass of run, executing with its
// sandbox's network namespace at netns and its interval's journal so far
// es, whose link the last daemon attached and did not pass (it still
// holds the outside's packets). Its connections to outside are closed
// where that link was a restore's with connections to close and es
// holds the closed entry its Closing journaled (those left of them:
// while held none is established); otherwise none is closed. Then the
// packets pass.
func (l *links) Reheld(run string, allow []unit.Dest, netns string, es []attest.Entry) error {
	l.mu.Lock()
	slot, ok := l.slot[run]
	l.mu.Unlock()
	if !ok {
		return nil
	}
	held, why, err := l.gw.Held(slot)
	if err != nil || !held {
		return err
	}
	if !slices.ContainsFunc(es, func(e attest.Entry) bool { return e.Kind == attest.ClosedKind }) {
		why = egress.Keep
	}
	l.mu.Lock()
	r, err := l.runOf(run, allow)
	if err == nil {
		err = r.Reheld(netns, why)
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	l.log.Warn("reconcile: passing the link the last daemon held", "run", run, "reason", why)
	return l.Pass(run)
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
	l.unpark(run)
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
