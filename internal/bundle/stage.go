package bundle

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Staged is a bundle read and judged, its objects staged.
type Staged struct {
	Header  Header
	Record  *record.Record
	Spec    unit.Spec
	Grants  unit.Grants
	Signers []attest.Signer
	Objects int   // objects staged, members or packed
	Bytes   int64 // their bytes

	dir    string
	staged map[record.Address]string
	sizes  map[record.Address]int64
	order  []record.Address
	refs   map[record.Address][]record.Address
	packs  int // pack members read
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

// Stage reads a bundle from r into a staging directory of st and judges
// it (the package doc lists the checks). On error nothing is left staged.
// Its steps follow the members' order, and each refuses before what comes
// after it is read: bundle.json's counts bound what the objects may cost,
// the record is read (and must be parked) before anything is staged, and
// the record is judged against the objects once all are staged.
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
	if s.Header, err = readHeader(tr, lim); err != nil {
		return nil, err
	}
	if s.Record, err = readRecord(tr, lim, s.Header.Run); err != nil {
		return nil, err
	}
	if s.dir, err = st.StagingDir("import"); err != nil {
		return nil, err
	}
	if err := s.stageObjects(ctx, tr, raw, lim); err != nil {
		return nil, err
	}
	if err := s.judge(opt); err != nil {
		return nil, err
	}
	return s, nil
}

// readHeader reads bundle.json, the first member (at most 64 KiB), and
// checks it (parseHeader). It comes first because its counts bound every
// object member after it.
func readHeader(tr *tar.Reader, lim Limits) (Header, error) {
	hb, err := readJSON(tr, "bundle.json", min(lim.JSON, 64<<10))
	if err != nil {
		return Header{}, err
	}
	return parseHeader(hb, lim)
}

// parseHeader decodes bundle.json (decodeHeader) and checks what it
// declares: this format, no negative count, and the objects' count and
// bytes within the limits.
func parseHeader(hb []byte, lim Limits) (Header, error) {
	var h Header
	if err := decodeHeader(hb, &h); err != nil {
		return h, err
	}
	switch {
	case h.Format != Format1 && h.Format != Format2:
		return h, fmt.Errorf("%w: format %q, this daemon reads %q and %q", ErrMalformed, h.Format, Format1, Format2)
	case h.Objects < 0 || h.Bytes < 0:
		return h, fmt.Errorf("%w: bundle.json declares %d objects of %d bytes", ErrMalformed, h.Objects, h.Bytes)
	case h.Bytes > lim.Total:
		return h, fmt.Errorf("%w: the bundle declares %d bytes of objects, the limit is %d", ErrLimit, h.Bytes, lim.Total)
	case h.Objects > lim.Objects:
		return h, fmt.Errorf("%w: the bundle declares %d objects, the limit is %d", ErrLimit, h.Objects, lim.Objects)
	}
	return h, nil
}

// readRecord reads record.json, the second member, decodes it (which
// verifies it from genesis) and refuses a run that is not parked. It
// comes before the staging directory is made: a bundle whose record is
// refused stages nothing.
func readRecord(tr *tar.Reader, lim Limits, run string) (*record.Record, error) {
	wire, err := readJSON(tr, "record.json", lim.JSON)
	if err != nil {
		return nil, err
	}
	rec, err := record.DecodeWire(wire)
	if err != nil {
		return nil, fmt.Errorf("bundle of %s: %w", run, err)
	}
	if rec.Phase() != record.PhaseParked {
		return nil, fmt.Errorf("%w: the run is %s: a bundle carries a parked run", ErrMalformed, rec.Phase())
	}
	return rec, nil
}

// stageObjects stages the objects/ members, and in format 2 the pack/
// members, until the tar ends; then the objects staged must be as many,
// and as large, as bundle.json declares.
// raw counts the stream's bytes, so that each member can be held to the
// bytes it took of it.
func (s *Staged) stageObjects(ctx context.Context, tr *tar.Reader, raw *counter, lim Limits) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		before := raw.n
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		m := entry{tr: tr, hdr: hdr, raw: raw, before: before}
		if s.Header.Format == Format2 && strings.HasPrefix(hdr.Name, "pack/") {
			err = s.stagePack(ctx, m, lim)
		} else {
			err = s.stageMember(ctx, m, lim)
		}
		if err != nil {
			return err
		}
	}
	if h := s.Header; s.Objects != h.Objects || s.Bytes != h.Bytes {
		return fmt.Errorf("%w: %d objects of %d bytes, bundle.json declares %d of %d", ErrMalformed, s.Objects, s.Bytes, h.Objects, h.Bytes)
	}
	return nil
}

// entry is a tar member as the stream gave it: its header, the reader
// positioned at its bytes, and the stream's byte count (raw) as it was
// when its header came (before), so that the member can be held to the
// bytes it took of the stream.
type entry struct {
	tr     *tar.Reader
	hdr    *tar.Header
	raw    *counter
	before int64
}

// took is how many bytes of the stream the member has taken so far.
func (e entry) took() int64 { return e.raw.n - e.before }

// stageMember stages one object member: [Staged.admit] checks its header
// before a byte of it is read; its bytes are hashed as they are written;
// and it is kept only if it read as its declared size, from no fewer
// bytes of the stream (entry.took), and hashes to the address it is
// named by.
func (s *Staged) stageMember(ctx context.Context, m entry, lim Limits) error {
	hdr := m.hdr
	a, name, err := s.admit(hdr, lim)
	if err != nil {
		return err
	}
	p := filepath.Join(s.dir, name)
	got, n, err := stageObject(ctx, m.tr, p, hdr.Size)
	if err != nil {
		return err
	}
	if n != hdr.Size {
		return fmt.Errorf("%w: object %s: %d of its %d bytes", ErrMalformed, a, n, hdr.Size)
	}
	if took := m.took(); n > took {
		// A member that reads as more than the stream carried is no
		// plain file, whatever its header says.
		return fmt.Errorf("%w: object %s read as %d bytes from %d bytes of stream", ErrMalformed, a, n, took)
	}
	if got != a {
		return fmt.Errorf("bundle of %s: %w", s.Header.Run, &store.CorruptError{Address: a, Got: got, Path: hdr.Name})
	}
	s.add(a, p, n)
	return nil
}

// add counts object a, staged at p with n bytes, in the order it came.
func (s *Staged) add(a record.Address, p string, n int64) {
	s.staged[a], s.sizes[a] = p, n
	s.order = append(s.order, a)
	s.Objects++
	s.Bytes += n
}

// fits checks an object of n bytes (what, said after at) against the
// count bundle.json declares, the object limit, and the bytes bundle.json
// declares are left: before anything of it is read, whether a member or
// packed.
func (s *Staged) fits(at, what string, n int64, lim Limits) error {
	h := s.Header
	switch {
	case s.Objects+1 > h.Objects:
		return fmt.Errorf("%w: %smore than the %d objects bundle.json declares", ErrMalformed, at, h.Objects)
	case n > lim.Object:
		return fmt.Errorf("%w: %s%s of %d bytes, the limit is %d", ErrLimit, at, what, n, lim.Object)
	case n > h.Bytes-s.Bytes:
		return fmt.Errorf("%w: %s%s of %d bytes is larger than what bundle.json declares is left (%d)", ErrMalformed, at, what, n, h.Bytes-s.Bytes)
	}
	return nil
}

// admit checks an object member's header before anything of it is read:
// a plain regular file, named objects/<address> spelled exactly, not a
// member twice, and within the count bundle.json declares, the object
// limit and the bytes bundle.json declares are left. It returns the
// address and the name without its objects/ prefix.
func (s *Staged) admit(hdr *tar.Header, lim Limits) (record.Address, string, error) {
	if err := member(hdr); err != nil {
		return record.Address{}, "", err
	}
	name, ok := strings.CutPrefix(hdr.Name, "objects/")
	if !ok {
		return record.Address{}, "", fmt.Errorf("%w: unexpected member %q", ErrMalformed, hdr.Name)
	}
	a, err := record.ParseAddress(record.AddressPrefix + name)
	if err != nil || strings.TrimPrefix(a.String(), record.AddressPrefix) != name {
		return record.Address{}, "", fmt.Errorf("%w: member %q is not objects/<address>", ErrMalformed, hdr.Name)
	}
	if _, dup := s.staged[a]; dup {
		return record.Address{}, "", fmt.Errorf("%w: object %s twice", ErrMalformed, a)
	}
	if err := s.fits("", "object "+a.String(), hdr.Size, lim); err != nil {
		return record.Address{}, "", err
	}
	return a, name, nil
}
