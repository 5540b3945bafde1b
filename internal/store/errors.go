package store

import (
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Errors returned by this package, wrapped with the run id or object
// address they concern; test with errors.Is. A refusal by pkg/record's
// rules is returned as pkg/record's [*record.SegmentError].
var (
	// ErrHeadMoved: an append whose expected head is not the run's head;
	// another writer appended first. Nothing was written.
	ErrHeadMoved = errors.New("head moved: another writer appended first")
	// ErrNoRun: no run has this id.
	ErrNoRun = errors.New("no such run")
	// ErrRunExists: Create or Import of an id already in use.
	ErrRunExists = errors.New("run already exists")
	// ErrGenesisHeld: Create or Import of a record whose genesis another
	// run of this store already has (a run has one timeline).
	ErrGenesisHeld = errors.New("this host already holds a run of this genesis")
	// ErrHandedOff: the run was handed off by an export and lives on
	// another host until a bundle extending its record is imported back.
	ErrHandedOff = errors.New("run handed off to another host")
	// ErrNotExtension: a record imported over a handed-off run that does
	// not extend the record held.
	ErrNotExtension = errors.New("record does not extend the run's record")
	// ErrRunID: a run id that is empty, too long or not UTF-8.
	ErrRunID = errors.New("malformed run id")
	// ErrMissingObject: an object that is not in the store, named by a
	// segment being appended, by a new object's refs, or by a read.
	ErrMissingObject = errors.New("object not in store")
	// ErrCorrupt: stored bytes that do not hash to their address, or a
	// directory listing that is not canonical. See [CorruptError].
	ErrCorrupt = errors.New("object corrupt")
	// ErrDamaged: a bbolt file or object directory that is not what this
	// package writes: unreadable pages, a short state, a stray file.
	ErrDamaged = errors.New("store damaged")
	// ErrSchema: a bbolt file written by a newer schema than this package's.
	ErrSchema = errors.New("unsupported store schema")
	// ErrLocked: another process holds the store open.
	ErrLocked = errors.New("store in use by another process")
	// ErrClosed: a call on a closed store.
	ErrClosed = errors.New("store closed")

	// Refusals of the call ledger (calls.go).

	// ErrUnknownCall: a call the run's ledger does not hold: never
	// dispatched, or dispatched in an interval that was not recorded.
	ErrUnknownCall = errors.New("no such call")
	// ErrCallExists: a dispatch of an id the run's ledger already holds.
	ErrCallExists = errors.New("call id already dispatched")
	// ErrCallResolved: a result for, or a delivery of, a call already
	// resolved.
	ErrCallResolved = errors.New("call already resolved")
	// ErrResultPosted: a second result for a call.
	ErrResultPosted = errors.New("a result was already posted")
	// ErrNoResult: the delivery of a call no result was posted for.
	ErrNoResult = errors.New("no result posted")
	// ErrInterval: a ledger write about an interval that is not the run's
	// open one (or, for an await filled in, its last recorded one).
	ErrInterval = errors.New("not the run's open interval")
	// ErrCallID: a call id or kind a record would not take.
	ErrCallID = errors.New("malformed call id or kind")
)

// CorruptError is an object whose bytes do not hash to its address. It
// wraps [ErrCorrupt].
type CorruptError struct {
	Address record.Address // the address asked for
	Got     record.Address // what the bytes hash to
	Path    string         // the file read
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("object %s corrupt: %s hashes to %s", e.Address, e.Path, e.Got)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }
