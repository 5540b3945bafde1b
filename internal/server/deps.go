package server

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/retention"
	"github.com/runrecordd/runrecordd/internal/runlog"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Deps are what the server answers from, each as the role it plays here:
// the daemon's operations, and the rooms the daemon wired that answer
// without a run's lock (daemon.Rooms). Production passes
// *daemon.Daemon and its rooms; the handlers' tests pass fakes.
type Deps struct {
	Daemon    Daemon
	Store     Store        // *store.Store
	Keys      Keys         // trust.Keys
	Collector Collector    // retention.Collector
	Events    Events       // *events.Hub
	Counts    Counts       // *metrics.Metrics
	Fleet     Fleet        // *member.Member
	Exporter  Exporter     // bundle.Exporter
	Placement Placement    // *drain.Local
	Metrics   http.Handler // /metrics
	Objects   http.Handler // the peer route serving objects (internal/fleet/transfer)
}

// Daemon is the daemon's operations, each under the run's lock where it
// takes one (*daemon.Daemon).
type Daemon interface {
	Host() answers.HostInfo
	ImportImage(ctx context.Context, r io.Reader, name string) (executor.Image, error)
	StartBooked(ctx context.Context, id string, spec unit.Spec, grants unit.Grants, o answers.Starting) (answers.Summary, error)
	List(phase *record.Phase) ([]answers.Summary, error)
	Run(id string) (answers.Summary, error)
	Park(ctx context.Context, id string) (answers.Parked, error)
	Resume(ctx context.Context, id string, secrets map[string]string) (answers.Resumed, error)
	Close(ctx context.Context, id, reason string) (answers.Summary, error)
	ParkAll(ctx context.Context, parallel int) ([]answers.Each[answers.Parked], error)
	Pin(id string, pin bool) (answers.Summary, error)
	Verify(ctx context.Context, id string) (answers.Verification, error)
	ImportWith(ctx context.Context, r io.Reader, id string, reclaim bool) (answers.Imported, error)
	PostResult(ctx context.Context, run, call string, payload []byte) (answers.Posted, error)
	Logs(ctx context.Context, id string, opt runlog.Options, emit func(runlog.Chunk) error) error
	Stdout(id string) string
	OpenJournal(id string) *attest.Journal
	StoredBytes(runs []answers.Summary) (int64, error)
}

// Placement is what this host can take now, asked by a peer before a
// drain (internal/fleet/drain).
type Placement interface {
	Offer(ctx context.Context, images []string) (drain.Offer, error)
}

// Exporter is the host's exports (internal/bundle).
type Exporter interface {
	Exportable(id string) error
	Export(ctx context.Context, id string, w io.Writer, handoff bool) error
}

// Store is the store as the server reads evidence from it: records
// verified from genesis, objects rehashed, a run's unit, and the call
// ledger (calls.List).
type Store interface {
	calls.Store
	Record(id string) (*record.Record, error)
	ReadRun(r store.Run) (unit.Spec, unit.Grants, error)
}

// Keys is the host's trusted-key set (internal/trust).
type Keys interface {
	Add(key, name string) (trust.Key, error)
	Remove(key string) error
	List() ([]trust.Key, error)
}

// Collector collects the store on demand (internal/retention).
type Collector interface {
	GC(ctx context.Context, keep, grace *time.Duration) (retention.Result, error)
}

// Events is the watchers' hub (internal/events).
type Events interface {
	Subscribe() (<-chan events.Event, func())
}

// Counts is what the server counts (internal/metrics).
type Counts interface {
	Failed(op, code string)
}

// Fleet is the daemon's part in a fleet (internal/fleet/member).
type Fleet interface {
	Migrate(ctx context.Context, id string, to record.Address) error
	Adopt(ctx context.Context, id string) error
	Drain(ctx context.Context, to []record.Address, parallel int) ([]drain.Outcome, error)
	Receive(ctx context.Context, from record.Address, h member.Handed) error
	Serves(key record.Address) error
	ServesObject(key, a record.Address) error
	ServesRecord(key record.Address, id string) error
	Owing(id string) (bool, error)
	Done(key record.Address, h member.Handed) error
	Held(key record.Address, h member.Handed) (bool, error)
	Expect(ctx context.Context, from, genesis record.Address) error
}
