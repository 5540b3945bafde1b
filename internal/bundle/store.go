package bundle

import (
	"context"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Staging is a store's staging area: [Stage] stages a bundle's objects
// there and [Staged.Adopt] adopts them into the store. *store.Store is one.
type Staging interface {
	StagingDir(prefix string) (string, error)
	Adopt(ctx context.Context, path string, refs ...record.Address) (record.Address, error)
}

// Objects reads a store's objects: what [Reached] and [Export] walk and
// stream. *store.Store is one.
type Objects interface {
	Refs(a record.Address) ([]record.Address, error)
	Size(a record.Address) (int64, error)
	// Open reads an object verified: a damaged store fails the export
	// rather than ship bad bytes.
	Open(a record.Address) (*store.Reader, error)
}

// Runs is a store's runs and their one timeline (docs/trust.md): what an
// export hands off and an import takes back or adds. *store.Store is one.
type Runs interface {
	Run(id string) (store.Run, error)
	Record(id string) (*record.Record, error)
	RunOfGenesis(g record.Address) (string, bool, error)
	HandedOff(id string) (store.Handoff, bool, error)
	HandOff(id string, head record.Address) error
	CheckExtend(id string, r *record.Record, reclaim bool) error
	Extend(id string, r *record.Record, copy, reclaim bool) (record.Address, error)
	ImportAs(id string, r *record.Record, copy bool) error
}

// Store is what [Export] and [Import] need of a store. *store.Store is one.
type Store interface {
	Staging
	Objects
	Runs
}

var _ Store = (*store.Store)(nil)
