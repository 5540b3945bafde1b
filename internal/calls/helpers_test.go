package calls

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// mustStore opens a store in a temporary directory. When the test ends it
// runs the store's fsck — every record verifies from genesis, every call
// ledger agrees with its record, every object a ledger names is there —
// and closes it.
func mustStore(t *testing.T) *store.Store {
	t.Helper()
	return mustOpenStore(t, t.TempDir())
}

func mustOpenStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := st.Check(context.Background()); err != nil && !errors.Is(err, store.ErrClosed) {
			t.Errorf("cleanup check: %v", err)
		}
		st.Close()
	})
	return st
}

// testHost is a calls.Daemon that records what the channel told it.
type testHost struct {
	mu         sync.Mutex
	dispatched []string
	awaiting   int
}

func (h *testHost) Dispatched(run string, c protocol.Call) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dispatched = append(h.dispatched, run+"/"+c.ID+":"+c.Kind)
}

func (h *testHost) Awaiting(run string, ch *Channel) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.awaiting++
}

func (h *testHost) said() ([]string, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.dispatched), h.awaiting
}

// newRun creates run r in st.
func newRun(t *testing.T, st *store.Store, run string) {
	t.Helper()
	if _, err := st.Create(run, record.Sum([]byte("unit "+run)), record.Sum([]byte("grants"))); err != nil {
		t.Fatal(err)
	}
}

// openChannel opens run's channel for its next interval in a short
// temporary directory (a unix socket path is at most 107 bytes), with the
// transcript restore restored when not nil.
func openChannel(t *testing.T, st *store.Store, run string, lim unit.Limits, restore *record.Address) (*Channel, *testHost) {
	t.Helper()
	dir, err := os.MkdirTemp("", "ch")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &testHost{}
	ch, err := Open(Config{Run: run, Dir: filepath.Join(dir, "ch", run), Spool: filepath.Join(dir, "spool", run), Limits: lim, Restore: restore}, st, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.Close)
	return ch, h
}

// park records ch's interval as a transcript park, as the daemon's park
// does (internal/interval): the Executed segment with the channel's
// account and an attestation whose journal holds the channel's spooled
// entries, then the Suspended segment; the channel closes.
func park(t *testing.T, st *store.Store, run string, ch *Channel) record.Snapshot {
	t.Helper()
	ch.Gate().Lock()
	defer ch.Gate().Unlock()
	snap, _, err := ch.Seal(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	att := attestation(t, st, ch)
	appendSegs(t, st, run, record.Execution(att, ch.Account()), record.Suspension(snap, put(t, st, "manifest")))
	ch.Close()
	return snap
}

// attestation stores a signed attestation of the channel's interval whose
// journal is the channel's spooled entries.
func attestation(t *testing.T, st *store.Store, ch *Channel) record.Address {
	t.Helper()
	n, r := ch.Spooled()
	jAddr, err := st.Put(t.Context(), attest.JournalReader(n, r))
	if err != nil {
		t.Fatal(err)
	}
	return sign(t, st, uint64(ch.Interval()), jAddr)
}

func sign(t *testing.T, st *store.Store, interval uint64, journal record.Address) record.Address {
	t.Helper()
	key, err := attest.LoadOrCreateKey(filepath.Join(t.TempDir(), "key"))
	if err != nil {
		t.Fatal(err)
	}
	signed, err := attest.Sign(&attest.Body{Interval: interval, Journal: journal, Receipt: journal,
		Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum([]byte("suspended"))}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return put(t, st, string(signed.Encode()))
}

func put(t *testing.T, st *store.Store, s string) record.Address {
	t.Helper()
	a, err := st.PutBytes([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func appendSegs(t *testing.T, st *store.Store, run string, segs ...record.Segment) {
	t.Helper()
	h, err := st.Head(run)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AppendAll(run, h, segs...); err != nil {
		t.Fatal(err)
	}
}
