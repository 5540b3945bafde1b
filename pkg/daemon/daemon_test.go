package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/bundle"
	"github.com/runrecordd/runrecordd/pkg/executor"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/store"
)

// TestLockRunUnknown: a request naming no run leaves no state behind.
func TestLockRunUnknown(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := &Daemon{st: st, runs: map[string]*run{}}
	for _, id := range []string{"nosuch", string(make([]byte, 4096))} {
		if _, err := d.lockRun(id); err == nil {
			t.Fatalf("lockRun(%.10q) found a run", id)
		}
	}
	if len(d.runs) != 0 {
		t.Fatalf("unknown ids left %d entries", len(d.runs))
	}
}

// The errors of a CRIU deadline and of a host without image parks have
// codes of their own, also when wrapped as the daemon wraps them.
func TestErrorOfCRIU(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("park r: executor: checkpoint r: %w: killed", executor.ErrCheckpointTimeout): api.CodeCheckpointTimeout,
		fmt.Errorf("resume r: executor: restore r: %w: killed", executor.ErrRestoreTimeout):     api.CodeRestoreTimeout,
		fmt.Errorf("run r: %w: probe failed", ErrImageParks):                                    api.CodeImageParks,
		fmt.Errorf("park r: %w", executor.ErrCheckpoint):                                        api.CodeCheckpointFailed,
	} {
		if got := ErrorOf(err).Code; got != want {
			t.Errorf("ErrorOf(%v) = %s, want %s", err, got, want)
		}
	}
}

// The CRIU deadline is the configured one, or 30 s plus a second per
// 64 MiB moved.
func TestCRIUDeadline(t *testing.T) {
	d := &Daemon{}
	for mem, want := range map[uint64]time.Duration{0: 30 * time.Second, 64<<20 - 1: 30 * time.Second, 512 << 20: 38 * time.Second, 8 << 30: 158 * time.Second} {
		if got := d.criuDeadline(mem); got != want {
			t.Errorf("deadline for %d bytes: %v, want %v", mem, got, want)
		}
	}
	d.cfg.CRIUDeadline = 3 * time.Second
	if got := d.criuDeadline(8 << 30); got != 3*time.Second {
		t.Errorf("configured deadline: %v", got)
	}
}

// A bundle's refusals have codes of their own, with the fields a caller
// acts on: the untrusted key and the segment.
func TestErrorOfBundle(t *testing.T) {
	key := record.Sum([]byte("key"))
	e := ErrorOf(fmt.Errorf("bundle of r: %w", &attest.UntrustedError{Index: 3, Key: key}))
	if e.Code != api.CodeUntrustedSigner || e.Signer != key.String() || e.Segment == nil || *e.Segment != 3 {
		t.Errorf("untrusted: %+v", e)
	}
	e = ErrorOf(fmt.Errorf("bundle of r: %w", &attest.PlaceError{Index: 1, Field: "genesis"}))
	if e.Code != api.CodeRecordInvalid || e.Segment == nil || *e.Segment != 1 {
		t.Errorf("place: %+v", e)
	}
	for err, want := range map[error]string{
		fmt.Errorf("bundle of r: %w: mount /", bundle.ErrPolicy): api.CodeGrantRefused,
		fmt.Errorf("%w: object of 5 GiB", bundle.ErrLimit):       api.CodeBundleLimit,
		fmt.Errorf("%w: sparse member", bundle.ErrMalformed):     api.CodeBadRequest,
		fmt.Errorf("key k: %w", store.ErrNotTrusted):             api.CodeNotFound,
		fmt.Errorf("%w: a key's name", store.ErrKeyName):         api.CodeBadRequest,
	} {
		if got := ErrorOf(err).Code; got != want {
			t.Errorf("ErrorOf(%v) = %s, want %s", err, got, want)
		}
	}
}
