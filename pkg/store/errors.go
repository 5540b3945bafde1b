package store

import (
	"errors"
	"fmt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Errors.
var (
	ErrHeadMoved     = errors.New("head moved: another writer appended first")
	ErrNoRun         = errors.New("no such run")
	ErrRunExists     = errors.New("run already exists")
	ErrMissingObject = errors.New("object not in store")
	ErrCorrupt       = errors.New("object corrupt")
	ErrDamaged       = errors.New("store damaged")
	ErrSchema        = errors.New("unsupported store schema")
	ErrBadRunID      = errors.New("bad run id")
)

// CorruptError is an object whose bytes do not hash to its address.
type CorruptError struct {
	Address record.Address
	Got     record.Address
	Path    string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("object %s corrupt: %s hashes to %s", e.Address, e.Path, e.Got)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }
