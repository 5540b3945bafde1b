package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// DirDomain starts every directory listing's canonical bytes.
const DirDomain = "runrecordd.dir/1"

// Entry is one file of a directory object.
type Entry struct {
	Name    string // path relative to the directory, '/'-separated, clean
	Mode    uint32 // permission bits (fs.FileMode.Perm)
	Size    uint64
	Address record.Address
}

// entryMin is the fewest bytes one entry takes in a listing.
const entryMin = 4 + 1 + 4 + 8 + 32

// A listing's limits, held by [EncodeListing], [DecodeListing] and so
// [Store.Ingest] alike (docs/store.md, "Directory objects").
const (
	// MaxNameBytes is the longest name: Linux's PATH_MAX (4096) less its
	// terminating NUL. No longer path can be opened on Linux.
	MaxNameBytes = 4095
	// MaxComponentBytes is the longest component of a name: Linux's
	// NAME_MAX.
	MaxComponentBytes = 255
	// MaxEntries is the most entries one listing holds: a CRIU image
	// directory of the most processes a bundle may ask for (16384), about
	// a dozen files each, takes about a fifth of it.
	MaxEntries = 1 << 20
	// MaxListingBytes is the largest listing. A listing is read whole, and
	// this is the default limit of a document a bundle importer decodes
	// (bundle.DefaultLimits.JSON), so every listing a store writes travels
	// in a bundle.
	MaxListingBytes = 64 << 20
)

// ErrListing is a directory listing whose entries break its rules: a name
// that is not a clean relative path or is over a name limit, a mode beyond
// the permission bits, a name twice, a file that is another's directory,
// or more entries or bytes than a listing may hold. [EncodeListing] and
// [Store.Ingest] refuse with it; [DecodeListing] with it and [ErrCorrupt].
var ErrListing = errors.New("directory listing refused")

// EncodeListing returns a directory's canonical listing: [DirDomain], the
// entry count (4 bytes), then the entries in byte order of name, each a
// 4-byte name length, the name, the mode (4), the size (8) and the file's
// address (32); integers big-endian. The directory object's address is the
// BLAKE3 of these bytes. Names must be clean relative paths within the name
// limits, unique, and no name may be both a file and another's directory;
// a refusal wraps [ErrListing].
func EncodeListing(entries []Entry) ([]byte, error) {
	size, err := listingSize(entries)
	if err != nil {
		return nil, err
	}
	es := slices.Clone(entries)
	slices.SortFunc(es, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	if err := checkEntries(es); err != nil {
		return nil, err
	}
	b := make([]byte, 0, size)
	b = append(b, DirDomain...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(es)))
	for _, e := range es {
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Name)))
		b = append(b, e.Name...)
		b = binary.BigEndian.AppendUint32(b, e.Mode)
		b = binary.BigEndian.AppendUint64(b, e.Size)
		b = append(b, e.Address[:]...)
	}
	return b, nil
}

// listingSize returns the bytes of the listing of es, refusing more
// entries or bytes than a listing may hold.
func listingSize(es []Entry) (int, error) {
	if len(es) > MaxEntries {
		return 0, fmt.Errorf("%w: %d entries, the limit is %d", ErrListing, len(es), MaxEntries)
	}
	n := len(DirDomain) + 4
	for _, e := range es {
		n += entryMin - 1 + len(e.Name)
	}
	if n > MaxListingBytes {
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrListing, n, MaxListingBytes)
	}
	return n, nil
}

// checkEntries checks sorted entries: names clean and within the limits,
// strictly increasing, modes within the permission bits, no file that is
// also a directory. The last is found in one pass, with no map of names:
// in a sorted listing every entry between a file X and an entry X/… has
// X as a prefix, so a stack of the entries that are prefixes of the
// current name, each one's next byte after the one below it not a '/',
// has on top the only one that can be the current name's directory.
func checkEntries(es []Entry) error {
	var stack []string
	for i, e := range es {
		if err := checkName(e.Name); err != nil {
			return fmt.Errorf("%w: entry %q: %v", ErrListing, e.Name, err)
		}
		if e.Mode&^uint32(fs.ModePerm) != 0 {
			return fmt.Errorf("%w: entry %q: mode %o beyond permission bits", ErrListing, e.Name, e.Mode)
		}
		if i > 0 && es[i-1].Name >= e.Name {
			return fmt.Errorf("%w: entry %q: duplicate or out of order", ErrListing, e.Name)
		}
		for len(stack) > 0 && !strings.HasPrefix(e.Name, stack[len(stack)-1]) {
			stack = stack[:len(stack)-1]
		}
		if n := len(stack); n > 0 && e.Name[len(stack[n-1])] == '/' {
			return fmt.Errorf("%w: entry %q: its directory %q is a file", ErrListing, e.Name, stack[n-1])
		}
		stack = append(stack, e.Name)
	}
	return nil
}

// checkName refuses a name that is not a clean relative path — empty, ".",
// "..", absolute, with an empty, "." or ".." component, a trailing '/' —
// that holds a NUL, or that is over [MaxNameBytes] or has a component
// over [MaxComponentBytes]. Any other byte is allowed: names are bytes, as
// Linux's are, not necessarily UTF-8.
func checkName(n string) error {
	if len(n) > MaxNameBytes {
		return fmt.Errorf("a name of %d bytes, the limit is %d", len(n), MaxNameBytes)
	}
	if strings.IndexByte(n, 0) >= 0 {
		return errors.New("not a clean relative path")
	}
	for c := range strings.SplitSeq(n, "/") {
		if c == "" || c == "." || c == ".." {
			return errors.New("not a clean relative path")
		}
		if len(c) > MaxComponentBytes {
			return fmt.Errorf("a component of %d bytes, the limit is %d", len(c), MaxComponentBytes)
		}
	}
	return nil
}

// DecodeListing parses a canonical listing. It accepts only the bytes
// [EncodeListing] writes; anything else is [ErrCorrupt], and entries that
// break a listing's rules or limits are [ErrListing] too. A count or size
// over the limits is refused before anything is allocated for it.
func DecodeListing(b []byte) ([]Entry, error) {
	bad := func(format string, args ...any) ([]Entry, error) {
		return nil, fmt.Errorf("%w: directory listing: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) > MaxListingBytes {
		return nil, fmt.Errorf("%w: %w: %d bytes, the limit is %d", ErrCorrupt, ErrListing, len(b), MaxListingBytes)
	}
	if len(b) < len(DirDomain)+4 || !bytes.HasPrefix(b, []byte(DirDomain)) {
		return bad("no %q header", DirDomain)
	}
	p := b[len(DirDomain):]
	n := binary.BigEndian.Uint32(p)
	p = p[4:]
	if n > MaxEntries {
		return nil, fmt.Errorf("%w: %w: %d entries, the limit is %d", ErrCorrupt, ErrListing, n, MaxEntries)
	}
	if uint64(n) > uint64(len(p))/entryMin {
		return bad("%d entries in %d bytes", n, len(p))
	}
	out := make([]Entry, 0, n)
	// The names are substrings of one copy of the listing: one allocation
	// instead of one per entry.
	all := string(b)
	for range n {
		if len(p) < 4 {
			return bad("truncated")
		}
		l := uint64(binary.BigEndian.Uint32(p))
		if l > MaxNameBytes {
			return nil, fmt.Errorf("%w: %w: a name of %d bytes, the limit is %d", ErrCorrupt, ErrListing, l, MaxNameBytes)
		}
		if uint64(len(p)) < 4+l+44 {
			return bad("truncated")
		}
		at := len(b) - len(p) + 4
		e := Entry{Name: all[at : at+int(l)]}
		p = p[4+l:]
		e.Mode = binary.BigEndian.Uint32(p)
		e.Size = binary.BigEndian.Uint64(p[4:])
		copy(e.Address[:], p[12:44])
		p = p[44:]
		out = append(out, e)
	}
	if len(p) != 0 {
		return bad("%d trailing bytes", len(p))
	}
	if err := checkEntries(out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return out, nil
}
