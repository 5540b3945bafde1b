package bundle

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/manifest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/store"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Format names the bundle layout (docs/bundle.md).
const Format = "runrecordd.bundle/1"

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
// the objects/ members and the sum of their sizes (the objects' bytes):
// not bundle.json or record.json, nor tar headers and padding.
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
}

// DefaultLimits are the daemon's limits unless its flags say otherwise.
var DefaultLimits = Limits{Object: 4 << 30, Total: 32 << 30, JSON: 64 << 20}

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

// Staged is a bundle read and judged, its objects staged.
type Staged struct {
	Header  Header
	Record  *record.Record
	Spec    unit.Spec
	Grants  unit.Grants
	Signers []attest.Signer
	Objects int   // members staged
	Bytes   int64 // their bytes

	dir    string
	staged map[record.Address]string
	sizes  map[record.Address]int64
	order  []record.Address
	refs   map[record.Address][]record.Address
}

// Close removes what is still staged.
func (s *Staged) Close() error {
	if s == nil || s.dir == "" {
		return nil
	}
	return os.RemoveAll(s.dir)
}

// Adopt moves the staged objects into st, each after its refs (the
// bundle's order, which [Stage] checked).
func (s *Staged) Adopt(ctx context.Context, st Staging) error {
	for _, a := range s.order {
		if _, err := st.Adopt(ctx, s.staged[a], s.refs[a]...); err != nil {
			return err
		}
	}
	return nil
}

// counter counts the bytes read from the bundle's stream.
type counter struct {
	r io.Reader
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// paxAllowed are the PAX records a member may carry; anything else (the
// GNU sparse records above all, which make a few bytes of tar read as
// gigabytes) is refused.
var paxAllowed = map[string]bool{"path": true, "size": true, "mtime": true, "atime": true, "ctime": true,
	"uid": true, "gid": true, "uname": true, "gname": true}

// member checks a member's header before anything of it is read.
func member(hdr *tar.Header) error {
	if hdr.Typeflag != tar.TypeReg {
		return fmt.Errorf("%w: member %q has type %q: only regular files (typeflag '0') are read, never sparse files, links or devices", ErrMalformed, hdr.Name, hdr.Typeflag)
	}
	for k := range hdr.PAXRecords {
		if !paxAllowed[k] {
			return fmt.Errorf("%w: member %q carries the PAX record %q (sparse and vendor records are refused)", ErrMalformed, hdr.Name, k)
		}
	}
	if hdr.Size < 0 {
		return fmt.Errorf("%w: member %q has size %d", ErrMalformed, hdr.Name, hdr.Size)
	}
	return nil
}

// readJSON reads the next member, which must be name, of at most max
// bytes, and decodes it strictly.
func readJSON(tr *tar.Reader, name string, max int64) ([]byte, error) {
	hdr, err := tr.Next()
	if err != nil || hdr.Name != name {
		return nil, fmt.Errorf("%w: %s expected next", ErrMalformed, name)
	}
	if err := member(hdr); err != nil {
		return nil, err
	}
	if hdr.Size > max {
		return nil, fmt.Errorf("%w: %s of %d bytes, the limit is %d", ErrLimit, name, hdr.Size, max)
	}
	b, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformed, name, err)
	}
	if int64(len(b)) != hdr.Size {
		return nil, fmt.Errorf("%w: %s: %d of %d bytes", ErrMalformed, name, len(b), hdr.Size)
	}
	return b, nil
}

// Stage reads a bundle from r into a staging directory of st and judges
// it (the package doc lists the checks). On error nothing is left staged.
func Stage(ctx context.Context, st Staging, r io.Reader, opt Options) (_ *Staged, err error) {
	lim := opt.Limits.Or(DefaultLimits)
	raw := &counter{r: r}
	tr := tar.NewReader(raw)
	s := &Staged{staged: map[record.Address]string{}, sizes: map[record.Address]int64{}, refs: map[record.Address][]record.Address{}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	hb, err := readJSON(tr, "bundle.json", min(lim.JSON, 64<<10))
	if err != nil {
		return nil, err
	}
	if err := decodeHeader(hb, &s.Header); err != nil {
		return nil, err
	}
	h := s.Header
	switch {
	case h.Format != Format:
		return nil, fmt.Errorf("%w: format %q, this daemon reads %q", ErrMalformed, h.Format, Format)
	case h.Objects < 0 || h.Bytes < 0:
		return nil, fmt.Errorf("%w: bundle.json declares %d objects of %d bytes", ErrMalformed, h.Objects, h.Bytes)
	case h.Bytes > lim.Total:
		return nil, fmt.Errorf("%w: the bundle declares %d bytes of objects, the limit is %d", ErrLimit, h.Bytes, lim.Total)
	}
	wire, err := readJSON(tr, "record.json", lim.JSON)
	if err != nil {
		return nil, err
	}
	rec, err := record.DecodeWire(wire)
	if err != nil {
		return nil, fmt.Errorf("bundle of %s: %w", h.Run, err)
	}
	s.Record = rec
	if rec.Phase() != record.Parked {
		return nil, fmt.Errorf("%w: the run is %s: a bundle carries a parked run", ErrMalformed, rec.Phase())
	}
	if s.dir, err = st.StagingDir("import"); err != nil {
		return nil, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		before := raw.n
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		if err := member(hdr); err != nil {
			return nil, err
		}
		name, ok := strings.CutPrefix(hdr.Name, "objects/")
		if !ok {
			return nil, fmt.Errorf("%w: unexpected member %q", ErrMalformed, hdr.Name)
		}
		a, err := record.ParseAddress(record.AddressPrefix + name)
		if err != nil || strings.TrimPrefix(a.String(), record.AddressPrefix) != name {
			return nil, fmt.Errorf("%w: member %q is not objects/<address>", ErrMalformed, hdr.Name)
		}
		if _, dup := s.staged[a]; dup {
			return nil, fmt.Errorf("%w: object %s twice", ErrMalformed, a)
		}
		switch {
		case s.Objects+1 > h.Objects:
			return nil, fmt.Errorf("%w: more than the %d objects bundle.json declares", ErrMalformed, h.Objects)
		case hdr.Size > lim.Object:
			return nil, fmt.Errorf("%w: object %s of %d bytes, the limit is %d", ErrLimit, a, hdr.Size, lim.Object)
		case hdr.Size > h.Bytes-s.Bytes:
			return nil, fmt.Errorf("%w: object %s of %d bytes is larger than what bundle.json declares is left (%d)", ErrMalformed, a, hdr.Size, h.Bytes-s.Bytes)
		}
		p := filepath.Join(s.dir, name)
		got, n, err := stageObject(ctx, tr, p, hdr.Size)
		if err != nil {
			return nil, err
		}
		if n != hdr.Size {
			return nil, fmt.Errorf("%w: object %s: %d of its %d bytes", ErrMalformed, a, n, hdr.Size)
		}
		if n > raw.n-before {
			// A member that reads as more than the stream carried is no
			// plain file, whatever its header says.
			return nil, fmt.Errorf("%w: object %s read as %d bytes from %d bytes of stream", ErrMalformed, a, n, raw.n-before)
		}
		if got != a {
			return nil, fmt.Errorf("bundle of %s: %w", h.Run, &store.CorruptError{Address: a, Got: got, Path: hdr.Name})
		}
		s.staged[a], s.sizes[a] = p, n
		s.order = append(s.order, a)
		s.Objects++
		s.Bytes += n
	}
	if s.Objects != h.Objects || s.Bytes != h.Bytes {
		return nil, fmt.Errorf("%w: %d objects of %d bytes, bundle.json declares %d of %d", ErrMalformed, s.Objects, s.Bytes, h.Objects, h.Bytes)
	}
	if err := s.judge(opt); err != nil {
		return nil, err
	}
	return s, nil
}

// headerKeys are bundle.json's fields, spelled exactly.
var headerKeys = map[string]bool{"format": true, "run": true, "objects": true, "bytes": true, "copy": true}

// decodeHeader decodes bundle.json, refusing a field it does not have
// (encoding/json alone would ignore one, and match "Run" as "run").
func decodeHeader(b []byte, h *Header) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return fmt.Errorf("%w: bundle.json: %w", ErrMalformed, err)
	}
	for k := range fields {
		if !headerKeys[k] {
			return fmt.Errorf("%w: bundle.json has a field %q", ErrMalformed, k)
		}
	}
	if err := json.Unmarshal(b, h); err != nil {
		return fmt.Errorf("%w: bundle.json: %w", ErrMalformed, err)
	}
	return nil
}

// judge checks the staged bundle's record against its objects. Only the
// bundle's members count: an object the importing store happens to hold is
// no member, so that a bundle is accepted or refused for what it carries
// (verify --file, in a scratch store, judges as an import does).
func (s *Staged) judge(opt Options) error {
	rec, run := s.Record, s.Header.Run
	have := func(a record.Address) bool { _, ok := s.staged[a]; return ok }
	// Objects decoded here (unit, grants, attestations, manifests,
	// listings) are read whole: each is capped like a JSON document.
	max := opt.Limits.Or(DefaultLimits).JSON
	read := func(a record.Address) ([]byte, error) {
		p, ok := s.staged[a]
		if !ok {
			return nil, fmt.Errorf("object %s: %w: the record reaches it, and the bundle does not carry it", a, store.ErrMissingObject)
		}
		if n := s.sizes[a]; n > max {
			return nil, fmt.Errorf("%w: object %s of %d bytes is decoded, and the limit of a decoded document is %d", ErrLimit, a, n, max)
		}
		return os.ReadFile(p)
	}
	// The unit and the grant set: the grants are a request this host
	// judges by its own policy.
	b, err := read(rec.Unit())
	if err != nil {
		return fmt.Errorf("bundle of %s: unit spec: %w", run, err)
	}
	spec, err := unit.DecodeSpec(b)
	if err == nil {
		err = spec.Validate()
	}
	if err != nil {
		return fmt.Errorf("bundle of %s: unit spec: %w", run, err)
	}
	if b, err = read(rec.Grants()); err != nil {
		return fmt.Errorf("bundle of %s: grant set: %w", run, err)
	}
	grants, err := unit.DecodeGrants(b)
	if err == nil {
		err = grants.Validate()
	}
	if errors.Is(err, unit.ErrSource) {
		// A mount no host grants is this host's policy refusing it.
		return fmt.Errorf("bundle of %s: grant set: %w: %w", run, ErrPolicy, err)
	}
	if err != nil {
		return fmt.Errorf("bundle of %s: grant set: %w", run, err)
	}
	s.Spec, s.Grants = *spec, *grants
	if opt.Policy != nil && (opt.Granted == nil || !opt.Granted(rec.Genesis())) {
		if err := opt.Policy.Check(s.Grants); err != nil {
			return fmt.Errorf("bundle of %s: %w", run, err)
		}
	}
	// Every attestation: signed, by a trusted key, at its place.
	// Every manifest names the keys its park form requires: one that
	// names none of a host's facts would match any host.
	for i := range rec.Len() {
		seg := rec.Segment(i)
		if seg.Kind != record.Suspended {
			continue
		}
		b, err := read(seg.Manifest)
		if err != nil {
			return fmt.Errorf("bundle of %s: segment %d: manifest: %w", run, i, err)
		}
		m, err := manifest.Decode(b)
		if err != nil {
			return fmt.Errorf("bundle of %s: segment %d: %w", run, i, err)
		}
		if miss := m.Missing(manifest.KeysFor(seg.Snapshot.IsTranscript())); len(miss) > 0 {
			return fmt.Errorf("%w: bundle of %s: segment %d: manifest %s lacks keys its park form requires: %s",
				ErrMalformed, run, i, seg.Manifest, strings.Join(miss, ", "))
		}
	}
	// An untrusted signer is reported first: what it signed is not
	// worth judging further.
	s.Signers, err = attest.CheckRecord(rec, read, opt.Trusted)
	if opt.Trusted != nil {
		if err := attest.Untrusted(s.Signers); err != nil {
			return fmt.Errorf("bundle of %s: %w", run, err)
		}
	}
	if err != nil {
		return fmt.Errorf("bundle of %s: %w", run, err)
	}
	// What the record reaches, and the refs each object is stored with.
	need := map[record.Address]bool{rec.Unit(): true, rec.Grants(): true}
	listed := map[record.Address]bool{} // a Resumed segment repeats its park's snapshot
	for i := range rec.Len() {
		seg := rec.Segment(i)
		switch seg.Kind {
		case record.Executed:
			need[seg.Attestation] = true
			b, err := read(seg.Attestation)
			if err != nil {
				return err
			}
			body, err := attest.Open(b, nil)
			if err != nil {
				return fmt.Errorf("bundle of %s: %w", run, &record.SegmentError{Index: i, Err: err})
			}
			// The run's evidence: the receipt and the journal. audit_prev
			// links the exporting host's audit chain, other runs'
			// attestations a bundle of one run does not carry.
			s.refs[seg.Attestation] = []record.Address{body.Receipt, body.Journal}
			need[body.Receipt], need[body.Journal] = true, true
		case record.Suspended:
			need[seg.Manifest] = true
			fallthrough
		case record.Resumed:
			for _, a := range seg.Snapshot.Addresses() {
				need[a] = true
				if seg.Snapshot.IsTranscript() || !have(a) || listed[a] {
					continue
				}
				listed[a] = true
				b, err := read(a)
				if err != nil {
					return err
				}
				es, err := store.DecodeListing(b)
				if err != nil {
					return fmt.Errorf("%w: bundle of %s: segment %d: snapshot %s: %w", ErrMalformed, run, i, a, err)
				}
				for _, e := range es {
					if n, ok := s.sizes[e.Address]; ok && uint64(n) != e.Size {
						return fmt.Errorf("%w: bundle of %s: segment %d: snapshot %s lists %q as %d bytes, and its object %s has %d",
							ErrMalformed, run, i, a, e.Name, e.Size, e.Address, n)
					}
					s.refs[a] = append(s.refs[a], e.Address)
					need[e.Address] = true
				}
			}
		}
	}
	for a := range need {
		if !have(a) {
			return fmt.Errorf("bundle of %s: object %s: %w: the record reaches it, and the bundle does not carry it", run, a, store.ErrMissingObject)
		}
	}
	for _, a := range s.order {
		if !need[a] {
			return fmt.Errorf("%w: object %s is not one the record reaches", ErrMalformed, a)
		}
	}
	// Each member after the members it refers to: the order they are
	// adopted in, so that a store never holds an object before its refs.
	at := make(map[record.Address]int, len(s.order))
	for i, a := range s.order {
		at[a] = i
	}
	for _, a := range s.order {
		for _, r := range s.refs[a] {
			if at[r] > at[a] {
				return fmt.Errorf("%w: object %s comes before %s, which it refers to", ErrMalformed, a, r)
			}
		}
	}
	return nil
}

// stageObject writes at most size bytes of r to p, hashing them as they
// are written, and stops at the first byte past size.
func stageObject(ctx context.Context, r io.Reader, p string, size int64) (record.Address, int64, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return record.Address{}, 0, err
	}
	defer f.Close()
	h := blake3.New(32, nil)
	buf := make([]byte, 1<<20)
	lr := io.LimitReader(r, size+1)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return record.Address{}, 0, err
		}
		k, rerr := lr.Read(buf)
		if k > 0 {
			if n+int64(k) > size {
				return record.Address{}, 0, fmt.Errorf("%w: %s: more bytes than its declared %d", ErrMalformed, filepath.Base(p), size)
			}
			h.Write(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				return record.Address{}, 0, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return record.Address{}, 0, fmt.Errorf("%w: %w", ErrMalformed, rerr)
		}
	}
	var a record.Address
	h.Sum(a[:0])
	return a, n, nil
}
