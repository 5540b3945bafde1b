package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/pkg/attest"
)

// The runs' names (docs/unit.md, names in an egress grant): where the
// host grants egress, the daemon answers every linked sandbox's DNS
// queries on the gateway (egress.DNSServer), for the names its run's grant
// lists and nothing else, asking the host's upstream resolver (serve
// --egress-resolver; without one no grant names a destination, and no
// query is answered). Each answer is journaled in the run's open interval,
// under the run's lock, before its addresses are allowed and the unit is
// told.

// MaxResolutions bounds the resolution entries of one interval: past it,
// an answer that would need an entry is refused (SERVFAIL) and allows
// nothing. A new interval (a resume, a refused park) starts again.
const MaxResolutions = 1024

// resolvLockWait bounds the wait of a query for its run's lock (an
// operation may hold it for a park): past it, the unit gets SERVFAIL.
const resolvLockWait = 2 * time.Second

// resolvConf is what a linked sandbox's /etc/resolv.conf says.
var resolvConf = "nameserver " + egress.GatewayAddr.String() + "\n"

var (
	errNoInterval = errors.New("egress resolver: the run has no open interval here")
	errTooMany    = fmt.Errorf("egress resolver: more than %d resolutions in the interval", MaxResolutions)
)

// serveNames starts the runs' resolver on the host's gateway, with
// upstream asked for their names. Without one (serve --egress-resolver)
// nothing answers there: the port stays free for one other daemon in
// the namespace, and a unit's queries go unanswered.
func (l *links) serveNames(d *Daemon, upstream netip.AddrPort) error {
	res := &egress.Resolver{Upstream: l.gw.Upstream(upstream), Ceiling: l.ceiling}
	l.names = true
	srv, err := l.gw.ServeDNS(egress.DNSConfig{Resolver: res, Run: l.holder(d), Resolved: func(slot int, res egress.Resolution) error { return l.resolved(d, slot, res) }})
	if err != nil {
		return err
	}
	l.dns = srv
	return nil
}

// closeNames stops the runs' resolver, if it serves.
func (l *links) closeNames() error {
	if l.dns == nil {
		return nil
	}
	err := l.dns.Close()
	l.dns = nil
	return err
}

// ResolvConf is the file every linked sandbox has as its resolv.conf,
// STATE-DIR/resolv.conf, written if missing or not as it should be (a
// restore on a host that never linked a sandbox finds it too).
func (l *links) ResolvConf() (string, error) {
	p := filepath.Join(filepath.Dir(l.dir), "resolv.conf")
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, err := os.ReadFile(p); err == nil && string(b) == resolvConf {
		return p, nil
	}
	err := atomicfile.Write(p, 0o644, func(f *os.File) error {
		_, err := f.WriteString(resolvConf)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("egress: %s: %w", p, err)
	}
	return p, nil
}

// runAt is the run holding slot here, "" for none.
func (l *links) runAt(slot int) string {
	for run, s := range l.slot {
		if s == slot {
			return run
		}
	}
	return ""
}

// holder is the resolver's [egress.DNSConfig.Run]: the handle of the run
// holding a slot, adopted with its grant's allow-list when this process
// has none (a sandbox a restarted daemon found).
func (l *links) holder(d *Daemon) func(slot int) *egress.Run {
	return func(slot int) *egress.Run {
		l.mu.Lock()
		run := l.runAt(slot)
		r := l.runs[run]
		l.mu.Unlock()
		if run == "" || r != nil {
			return r
		}
		st, err := d.st.Run(run)
		if err != nil {
			return nil
		}
		_, g, err := d.st.ReadRun(st)
		if err != nil {
			l.log.Warn("egress resolver: the grants of a run not read", "run", run, "err", err)
			return nil
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.slot[run] != slot {
			return nil
		}
		if r = l.runs[run]; r == nil {
			if r, err = l.gw.Adopt(slot, g.Egress); err != nil {
				return nil
			}
			l.runs[run] = r
		}
		return r
	}
}

// resolved is the resolver's [egress.DNSConfig.Resolved] for d: res, an answer
// for the run holding slot, is journaled in its open interval, and the
// interval's mark saved, under the run's lock. An answer with the same
// addresses as the name's last entry in the interval needs none (it
// renews their time); past MaxResolutions entries an answer that needs
// one is refused.
func (l *links) resolved(d *Daemon, slot int, res egress.Resolution) error {
	l.mu.Lock()
	id := l.runAt(slot)
	l.mu.Unlock()
	r := d.runs.peek(id)
	if id == "" || r == nil {
		return errNoInterval
	}
	for t0 := time.Now(); !r.mu.TryLock(); time.Sleep(5 * time.Millisecond) {
		if time.Since(t0) > resolvLockWait {
			return fmt.Errorf("egress resolver: run %s: its lock is held", id)
		}
	}
	defer r.mu.Unlock()
	l.mu.Lock()
	moved := l.slot[id] != slot
	l.mu.Unlock()
	if moved || r.live == nil || r.live.iv == nil || r.live.iv.Ended() {
		return errNoInterval
	}
	iv := r.live.iv
	e, err := resolutionEntry(iv.Events(), res, time.Now().UnixNano())
	if err != nil || e == nil {
		return err
	}
	iv.Journal(*e)
	if err := iv.Save(); err != nil {
		return fmt.Errorf("egress resolver: run %s: the interval's mark: %w", id, err)
	}
	return nil
}

// resolutionEntry is the journal entry res needs in an interval whose
// entries so far are es: nil when the name's last resolution there gave
// the same addresses; errTooMany past MaxResolutions.
func resolutionEntry(es []attest.Entry, res egress.Resolution, atNS int64) (*attest.Entry, error) {
	n := 0
	var last *attest.Resolution
	for _, e := range es {
		if e.Kind != attest.ResolutionKind {
			continue
		}
		n++
		if r, err := attest.DecodeResolution(e.Data); err == nil && r.Name == res.Name {
			last = &r
		}
	}
	if last != nil && sameAddrs(last.Addrs, res.Addrs) {
		return nil, nil
	}
	if n >= MaxResolutions {
		return nil, errTooMany
	}
	e, err := attest.Resolution{Name: res.Name, TTLSec: uint32(res.TTL / time.Second), Addrs: res.Addrs}.Entry(atNS)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// sameAddrs is whether a and b hold the same addresses, in any order.
func sameAddrs(a, b []netip.Addr) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Addr.Compare)
	slices.SortFunc(b, netip.Addr.Compare)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
