package forms

import (
	"fmt"
	"regexp"

	"github.com/runrecordd/runrecordd/internal/store"
)

var runID = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// CheckID refuses (store.ErrRunID) a run id this host does not take: one
// that is not 1 to 64 of A-Z a-z 0-9 _ . - (not starting with . or -), and
// one in the form of a transcript interval's sandbox id (TranscriptSuffix),
// which would make the sandboxes of two runs one.
func CheckID(id string) error {
	if !runID.MatchString(id) {
		return fmt.Errorf("%w: run id %q: use 1 to 64 of A-Z a-z 0-9 _ . - (not starting with . or -)", store.ErrRunID, id)
	}
	if TranscriptSuffix.MatchString(id) {
		return fmt.Errorf("%w: run id %q: an id may not end in _t and digits (the form of a transcript interval's sandbox id)", store.ErrRunID, id)
	}
	return nil
}
