package daemon

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/store"
)

// BundleFormat names the bundle layout (docs/bundle.md).
const BundleFormat = bundle.Format

// ErrBundle is a bundle that is not one this daemon reads.
var ErrBundle = bundle.ErrMalformed

// bundleHeader is a bundle's first member, bundle.json.
type bundleHeader = bundle.Header

// objectsOf returns every object run's record reaches — its unit spec and
// grant set, every object a segment names, and what those declared as refs —
// ordered so that each object comes after the objects it refers to (the
// order an importer must store them in).
func (d *Daemon) objectsOf(rec *record.Record) ([]record.Address, error) {
	// The unit spec and grant set first: a store without them (or a
	// bundle) cannot restart the unit, and Verify says so.
	roots := []record.Address{rec.Unit(), rec.Grants()}
	for i := range rec.Len() {
		s := rec.Segment(i)
		switch s.Kind {
		case record.Executed:
			roots = append(roots, s.Attestation)
		case record.Suspended:
			roots = append(roots, s.Manifest)
			roots = append(roots, s.Snapshot.Addresses()...)
		}
	}
	seen := map[record.Address]bool{}
	var out []record.Address
	var visit func(a record.Address) error
	visit = func(a record.Address) error {
		if seen[a] {
			return nil
		}
		seen[a] = true
		refs, err := d.st.Refs(a)
		if err != nil {
			return err
		}
		for _, r := range refs {
			if err := visit(r); err != nil {
				return err
			}
		}
		out = append(out, a)
		return nil
	}
	for _, a := range roots {
		if err := visit(a); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Exportable says whether run id can be exported now: only a parked run
// can. A bundle hands a run to another host to resume, and only a parked
// run has a snapshot to resume from; an executing run exported would
// arrive with nothing to resume and no sandbox (lost), and a closed one
// has nothing left to hand over (its record is served as it is, GET
// /v1/runs/{id}/record).
func (d *Daemon) Exportable(id string) error {
	st, err := d.st.Run(id)
	if err != nil {
		return err
	}
	if err := phaseErr(id, st.Phase, record.Parked); err != nil {
		return fmt.Errorf("export: %w: only a parked run can be exported (park it first)", err)
	}
	return nil
}

// Export writes run id's bundle to w: a tar of bundle.json, record.json
// (the record's wire form) and objects/<address> for every object the
// record reaches, each after the objects it refers to. Objects are read
// verified, so a damaged store fails the export rather than shipping bad
// bytes.
func (d *Daemon) Export(ctx context.Context, id string, w io.Writer) error {
	// The phase and the record are read under the run's lock, so that a
	// resume or a close cannot come between them; the objects of a parked
	// record never change, and are streamed without it.
	r, err := d.lockRun(id)
	if err != nil {
		return err
	}
	err = d.Exportable(id)
	var rec *record.Record
	if err == nil {
		rec, err = d.st.Record(id)
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	objs, err := d.objectsOf(rec)
	if err != nil {
		return err
	}
	h := bundleHeader{Format: BundleFormat, Run: id, Objects: len(objs)}
	sizes := make([]int64, len(objs))
	for i, a := range objs {
		if sizes[i], err = d.st.Size(a); err != nil {
			return err
		}
		h.Bytes += sizes[i]
	}
	tw := tar.NewWriter(w)
	hb, _ := json.MarshalIndent(h, "", "  ")
	if err := writeMember(tw, "bundle.json", hb); err != nil {
		return err
	}
	if err := writeMember(tw, "record.json", rec.EncodeWire()); err != nil {
		return err
	}
	for i, a := range objs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: "objects/" + strings.TrimPrefix(a.String(), record.AddressPrefix), Mode: 0o444, Size: sizes[i], Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		rd, err := d.st.Open(a)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, rd)
		rd.Close()
		if err != nil {
			return fmt.Errorf("export %s: object %s: %w", id, a, err)
		}
	}
	return tw.Close()
}

func writeMember(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o444, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}

// Import reads a bundle and stores its run as id (the bundle's own id when
// empty). It accepts nothing until everything checks (pkg/bundle): the
// members are plain files within the limits and the sizes declared; the
// record verifies from genesis; every attestation is signed by a key this
// host trusts and stands at its place; every manifest names the keys its
// park form requires; the grant set passes this host's policy; every
// object the record reaches is there and every member is reached. Only
// then are the objects adopted into the store and the record stored. A
// refused bundle leaves the store as it was (its staged files are
// removed).
func (d *Daemon) Import(ctx context.Context, r io.Reader, id string) (api.Import, error) {
	if id != "" {
		if err := checkID(id); err != nil {
			return api.Import{}, err
		}
	}
	sb, err := bundle.Stage(ctx, d.st, r, bundle.Options{Limits: d.cfg.BundleLimits, Trusted: d.trusted, Policy: d.bundlePolicy()})
	if err != nil {
		return api.Import{}, err
	}
	defer sb.Close()
	if id == "" {
		id = sb.Header.Run
	}
	if err := checkID(id); err != nil {
		return api.Import{}, err
	}
	rl := d.lock(id)
	defer rl.mu.Unlock()
	if _, err := d.st.Run(id); err == nil {
		return api.Import{}, fmt.Errorf("run %s: %w", id, store.ErrRunExists)
	}
	if err := sb.Adopt(ctx, d.st); err != nil {
		return api.Import{}, err
	}
	if err := d.st.Import(id, sb.Record); err != nil {
		return api.Import{}, err
	}
	sum, err := d.summary(id, rl)
	if err != nil {
		return api.Import{}, err
	}
	d.log.Info("run imported", "run", id, "from", sb.Header.Run, "objects", sb.Objects, "bytes", sb.Bytes)
	return api.Import{Run: sum, Objects: sb.Objects, Bytes: sb.Bytes, Grants: grantsOf(sb.Grants), Signers: d.signersOf(sb.Signers)}, nil
}
