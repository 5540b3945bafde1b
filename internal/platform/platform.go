// Package platform is a platform key's tenancy on a host: the runs each
// platform key started here (its books, kept under the state directory,
// beside the record and never in it), the quotas it is held to, and the
// mount policy of the runs it asks for (docs/fleet.md, "Roles"). A
// platform key reaches a host over the fleet's mutual-TLS listener
// (internal/fleet/peer); the operator's unix socket is never held to any of it.
package platform

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ErrQuota is a run a platform key may not start: it is at one of its
// quotas (api.CodeQuota).
var ErrQuota = errors.New("platform quota reached")

// Defaults of a platform key's quotas (serve --platform-runs,
// --platform-store-bytes).
const (
	DefaultRuns       = 64
	DefaultStoreBytes = 16 << 30
)

// Limits hold every platform key on this host: each key's quotas, and the
// host paths the runs it asks for may mount read-only.
type Limits struct {
	// Runs is how many of a key's runs may be here at once, not closed
	// and not handed off.
	Runs int
	// StoreBytes is how many bytes of this host's store a key's runs may
	// reach (every object their records reach, images included, each
	// object counted once) before the key may start no more.
	StoreBytes int64
	// Mounts are the host paths under which a platform run's read-only
	// mount sources may lie; empty (the default) allows none.
	Mounts []string
	// EgressAllow is the host's egress ceiling (serve --egress-allow),
	// the same for a platform's runs as for the operator's; EgressNames,
	// whether the host resolves names (serve --egress-resolver).
	EgressAllow []netip.Prefix
	EgressNames bool
}

// Policy is the policy a platform run's grants are judged by: a bundle's
// (bundle.HostPolicy) over the platform's own mount allow-list and the
// host's egress ceiling — never
// the state directory or the kernel's trees, every limit at most a
// bundle's, memory and CPU at most the host's.
func (l Limits) Policy(stateDir string) *bundle.Policy {
	p := bundle.HostPolicy(l.Mounts, stateDir)
	p.EgressAllow, p.EgressNames = l.EgressAllow, l.EgressNames
	return p
}

// Books record which platform key started which run on this host: one
// file per run under DIR, holding the key id. A run with no book is the
// operator's. Safe for concurrent use.
type Books struct {
	dir   string
	mu    sync.Mutex
	owner map[string]record.Address
	// starting serializes each key's quota check with its start.
	starting map[record.Address]*sync.Mutex
}

// Dir is where a state directory keeps the books.
func Dir(stateDir string) string { return filepath.Join(stateDir, "platform") }

// Open reads the books under dir, making it if absent. A file that is
// not a key id is an error: the books are this host's own, and a damaged
// one must not hand a run to nobody (or to anybody) silently.
func Open(dir string) (*Books, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("platform: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("platform: %w", err)
	}
	b := &Books{dir: dir, owner: map[string]record.Address{}, starting: map[record.Address]*sync.Mutex{}}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue // a write a crash interrupted
		}
		key, err := readBook(dir, e.Name())
		if err != nil {
			return nil, err
		}
		b.owner[e.Name()] = key
	}
	return b, nil
}

// Owner is the platform key that started run, if one did.
func (b *Books) Owner(run string) (record.Address, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.owner[run]
	return k, ok
}

// Booked reads run's book in the state directory stateDir without the
// books open: the key that started run, or the zero address when none
// did (the operator's run). A book that cannot be read, or holds no key
// id, is an error.
func Booked(stateDir, run string) (record.Address, error) {
	if err := checkRun(run); err != nil {
		return record.Address{}, err
	}
	key, err := readBook(Dir(stateDir), run)
	if errors.Is(err, os.ErrNotExist) {
		return record.Address{}, nil
	}
	return key, err
}

// readBook reads run's book under dir: the key id it holds.
func readBook(dir, run string) (record.Address, error) {
	text, err := os.ReadFile(filepath.Join(dir, run))
	if err != nil {
		return record.Address{}, fmt.Errorf("platform: %w", err)
	}
	key, err := record.ParseAddress(strings.TrimSpace(string(text)))
	if err != nil {
		return record.Address{}, fmt.Errorf("platform: run %s's book: %w", run, err)
	}
	return key, nil
}

// Owns reports whether key started run.
func (b *Books) Owns(key record.Address, run string) bool {
	k, ok := b.Owner(run)
	return ok && k == key
}

// Runs are the runs key started here, in order.
func (b *Books) Runs(key record.Address) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id, k := range b.owner {
		if k == key {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// Keep books run as key's, durably. run is a run id the daemon took
// (forms.CheckID), so a file name.
func (b *Books) Keep(run string, key record.Address) error {
	if err := checkRun(run); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(b.dir, run), 0o600, func(f *os.File) error {
		_, err := f.WriteString(key.String() + "\n")
		return err
	}); err != nil {
		return fmt.Errorf("platform: %w", err)
	}
	b.mu.Lock()
	b.owner[run] = key
	b.mu.Unlock()
	return nil
}

// checkRun refuses a run id that is not a file name of the books.
func checkRun(run string) error {
	if run == "" || strings.ContainsAny(run, "/\x00") || strings.HasPrefix(run, ".") {
		return fmt.Errorf("platform: run id %q", run)
	}
	return nil
}

// Drop takes run's book back: a start booked and then refused.
func (b *Books) Drop(run string) error {
	if err := checkRun(run); err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.owner, run)
	b.mu.Unlock()
	if err := os.Remove(filepath.Join(b.dir, run)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("platform: %w", err)
	}
	return nil
}

// Prune drops every book whose run does not exist (exists says), as a
// crash between a start's book and its genesis leaves: such a book must
// not hand a later run of that id to its key. A book is forgotten here
// even when its file cannot be removed (the error says which).
func (b *Books) Prune(exists func(run string) bool) error {
	b.mu.Lock()
	var gone []string
	for run := range b.owner {
		if !exists(run) {
			gone = append(gone, run)
		}
	}
	b.mu.Unlock()
	var errs []error
	for _, run := range gone {
		errs = append(errs, b.Drop(run))
	}
	return errors.Join(errs...)
}

// Starting holds key's starts one at a time, so that two starts cannot
// both pass a quota only one of them fits; the caller calls the returned
// function once its start is booked or refused.
func (b *Books) Starting(key record.Address) func() {
	b.mu.Lock()
	m, ok := b.starting[key]
	if !ok {
		m = &sync.Mutex{}
		b.starting[key] = m
	}
	b.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// Held is what a key's runs hold on this host now, as the quotas count it.
type Held struct {
	Runs       int   // not closed, not handed off
	StoreBytes int64 // every object their records reach, once
}

// Check refuses a new run of a key that already holds held, under
// limits: its grants against the platform's policy (bundle.ErrPolicy),
// then its quotas (ErrQuota).
func (l Limits) Check(policy *bundle.Policy, g unit.Grants, held Held) error {
	if err := policy.Check(g); err != nil {
		return err
	}
	if held.Runs >= l.Runs {
		return fmt.Errorf("%w: %d runs at once (serve --platform-runs %d)", ErrQuota, held.Runs, l.Runs)
	}
	if held.StoreBytes >= l.StoreBytes {
		return fmt.Errorf("%w: its runs hold %d bytes of the store (serve --platform-store-bytes %d)", ErrQuota, held.StoreBytes, l.StoreBytes)
	}
	return nil
}
