package store

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Hashed is a staged file's hash as its producer's caller computed it:
// the BLAKE3 of the file's first Size bytes.
type Hashed struct {
	Size    int64
	Address record.Address
}

// IngestHashed is [Store.Ingest] for a caller that has already hashed some
// of the staged files, typically while their producer wrote them. known
// maps a file's name in the listing ('/'-separated, relative to staging)
// to its hash; those files are not read again, and every other file is
// hashed as Ingest hashes it. Everything else is as in Ingest: the tree is
// made durable before any name, files are renamed into place, the listing
// object records its files as refs, and no collection runs in between.
//
// The caller vouches for every address it passes: it computed it in this
// process from the bytes the file holds, and nothing writes the file any
// more. The store checks only that each file in known is staged and has
// the size hashed (a file that grew or shrank since is an error). It cannot
// tell a wrong address from a right one without the hashing this call
// saves: a wrong one would store the file under an address its bytes do not
// hash to, which [Store.Verify], [Store.VerifyDir] and [Store.Check] then
// report as [ErrCorrupt], and which a resume's precondition on the
// snapshot refuses. So pass only addresses computed from the bytes, never
// ones taken from elsewhere (a record, a bundle, a peer): for those,
// Ingest.
func (s *Store) IngestHashed(ctx context.Context, staging string, known map[string]Hashed) (record.Address, IngestStats, error) {
	return s.ingest(ctx, staging, known, nil)
}

// knownStaged checks that every file in known is one of the staged files.
func knownStaged(staging string, files []string, known map[string]Hashed) error {
	if len(known) == 0 {
		return nil
	}
	staged := make(map[string]bool, len(files))
	for _, p := range files {
		rel, err := filepath.Rel(staging, p)
		if err != nil {
			return err
		}
		staged[filepath.ToSlash(rel)] = true
	}
	for name := range known {
		if !staged[name] {
			return fmt.Errorf("%q was hashed but is not a staged file", name)
		}
	}
	return nil
}
