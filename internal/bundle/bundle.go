package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// The bundle layouts (docs/bundle.md). Format is the one [Export] writes;
// [Stage] reads both.
const (
	// Format1 carries every object as a member objects/<address>.
	Format1 = "runrecordd.bundle/1"
	// Format2 carries objects of at most [PackObject] bytes in pack/N
	// members, many to a member, and larger ones as in Format1.
	Format2 = "runrecordd.bundle/2"
	// Format is the layout [Export] writes.
	Format = Format2
)

// Errors. A refusal wraps one of these; test with errors.Is.
var (
	// ErrMalformed is a bundle that is not one this package reads: members
	// out of order, of another type (a sparse file, a link), a member the
	// record does not reach, a size that disagrees with bundle.json or with
	// a listing, a field bundle.json does not have, a listing that does not
	// decode. An object the record reaches that is not a member is
	// [store.ErrMissingObject].
	ErrMalformed = errors.New("malformed bundle")
	// ErrLimit is a bundle, member or JSON document over a [Limits] cap.
	ErrLimit = errors.New("bundle over a limit")
	// ErrPolicy is a grant set the importing host's [Policy] refuses.
	ErrPolicy = errors.New("grant refused by this host's policy")
)

// Header is a bundle's first member, bundle.json. Objects and Bytes count
// the objects the bundle carries (each objects/ member, and each object
// of a pack) and the sum of their sizes (the objects' bytes): not
// bundle.json or record.json, nor tar headers and padding, nor a pack's
// lengths.
type Header struct {
	Format  string `json:"format"`
	Run     string `json:"run"` // the run's id on the exporting host
	Objects int    `json:"objects"`
	Bytes   int64  `json:"bytes"`
	// Copy marks a bundle exported without handing the run off: the
	// source still holds it, so an importing host holds it as a copy
	// (never resumed, never closed, exported again only as a copy) until
	// a handoff bundle of the run arrives (docs/trust.md).
	Copy bool `json:"copy,omitempty"`
}

// Limits cap what one bundle may cost. docs/limits.md gives the defaults.
type Limits struct {
	Object int64 // one object's bytes
	Total  int64 // all objects' bytes together
	JSON   int64 // one JSON member (bundle.json, record.json)
	// Objects caps bundle.json's count of objects. However small, each
	// costs the staging area a file (an inode and a block) and the
	// importer a few hundred bytes of memory, and a pack carries one in as
	// few as 2 bytes of stream: the count, not only the bytes, is bounded.
	Objects int
}

// DefaultLimits are the daemon's limits unless its flags say otherwise.
// The default count, 2 Mi objects, is the default Total in 16 KiB chunks
// (docs/chunked-images.md).
var DefaultLimits = Limits{Object: 4 << 30, Total: 32 << 30, JSON: 64 << 20, Objects: 1 << 21}

// Or returns l with each zero field taken from def.
func (l Limits) Or(def Limits) Limits {
	if l.Object <= 0 {
		l.Object = def.Object
	}
	if l.Total <= 0 {
		l.Total = def.Total
	}
	if l.JSON <= 0 {
		l.JSON = def.JSON
	}
	if l.Objects <= 0 {
		l.Objects = def.Objects
	}
	return l
}

// Options are what [Stage] judges a bundle by.
type Options struct {
	Limits Limits
	// Trusted says whether a signer's key id is trusted; a bundle with
	// any other signer is refused. Nil judges no signer (verify --file
	// without a daemon reports them).
	Trusted func(record.Address) bool
	// Policy judges the grant set; nil judges nothing (verify --file).
	Policy *Policy
	// Granted says whether this host already granted the grant set of a
	// run with this genesis (it holds the run, handed off or as a copy):
	// the genesis binds grants_id, so the bundle's grants are the very
	// ones this host ran the unit under, and Policy is not applied to
	// them again (a run started here with a host mount could otherwise
	// never come back). Nil: none.
	Granted func(genesis record.Address) bool
}

// headerKeys are bundle.json's fields, spelled exactly; all but copy are
// required.
var headerKeys = map[string]bool{"format": true, "run": true, "objects": true, "bytes": true, "copy": false}

// decodeHeader decodes bundle.json: one JSON object with each required
// field, no other (encoding/json alone would ignore one, and match "Run"
// as "run"), none twice (it would keep the last) and none null (it would
// read a default), and a run id that is not empty.
func decodeHeader(b []byte, h *Header) error {
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("%w: bundle.json is not a JSON object", ErrMalformed)
	}
	seen := map[string]bool{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return fmt.Errorf("%w: bundle.json: %w", ErrMalformed, err)
		}
		k, _ := t.(string)
		if _, ok := headerKeys[k]; !ok {
			return fmt.Errorf("%w: bundle.json has a field %q", ErrMalformed, k)
		}
		if seen[k] {
			return fmt.Errorf("%w: bundle.json has the field %q twice", ErrMalformed, k)
		}
		seen[k] = true
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return fmt.Errorf("%w: bundle.json: %w", ErrMalformed, err)
		}
		if string(v) == "null" {
			return fmt.Errorf("%w: bundle.json's %q is null", ErrMalformed, k)
		}
	}
	if _, err := d.Token(); err != nil {
		return fmt.Errorf("%w: bundle.json: %w", ErrMalformed, err)
	}
	if _, err := d.Token(); err != io.EOF {
		return fmt.Errorf("%w: bundle.json: data after the object", ErrMalformed)
	}
	for _, k := range []string{"format", "run", "objects", "bytes"} {
		if !seen[k] {
			return fmt.Errorf("%w: bundle.json has no %q", ErrMalformed, k)
		}
	}
	if err := json.Unmarshal(b, h); err != nil {
		return fmt.Errorf("%w: bundle.json: %w", ErrMalformed, err)
	}
	if h.Run == "" {
		return fmt.Errorf("%w: bundle.json's run is empty", ErrMalformed)
	}
	return nil
}
