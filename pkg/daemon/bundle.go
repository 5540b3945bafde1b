package daemon

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
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
// order an importer must store them in). Without images, image snapshots
// are left out: those of a closed run whose snapshots were released.
func (d *Daemon) objectsOf(rec *record.Record, images bool) ([]record.Address, error) {
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
			if images || s.Snapshot.IsTranscript() {
				roots = append(roots, s.Snapshot.Addresses()...)
			}
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
	// Results posted here for calls the run still awaits stay here: a
	// bundle does not carry them, and the host importing it would show
	// those calls as unanswered.
	if held, err := d.resultsHeld(id); err == nil && len(held) > 0 {
		return fmt.Errorf("export %s: %w: results are posted here for %s, which the run still awaits with others; post the rest (the run resumes here), or close it", id, ErrResultsHeld, strings.Join(held, ", "))
	}
	return nil
}

// ErrResultsHeld refuses the export of a run with results posted on this
// host for calls it still awaits.
var ErrResultsHeld = errors.New("results held on this host")

// Export writes run id's bundle to w: a tar of bundle.json, record.json
// (the record's wire form) and objects/<address> for every object the
// record reaches, each after the objects it refers to. Objects are read
// verified, so a damaged store fails the export rather than shipping bad
// bytes.
//
// With handoff (the default of the API and the CLI) the run is handed off
// before the first byte is written: from then on this host refuses to
// resume, close or post results to it, until a bundle extending its record
// is imported back. An export that fails before its bundle is whole takes
// the handoff back. Without handoff the bundle is marked a copy.
func (d *Daemon) Export(ctx context.Context, id string, w io.Writer, handoff bool) (err error) {
	// The phase and the record are read, and the handoff made, under the
	// run's lock, so that a resume or a close cannot come between them;
	// the objects of a parked record never change, and are streamed
	// without it.
	r, err := d.lockRun(id)
	if err != nil {
		return err
	}
	err = d.Exportable(id)
	var rec *record.Record
	if err == nil {
		rec, err = d.st.Record(id)
	}
	var held store.Handoff
	var wasOff bool
	if err == nil {
		held, wasOff, err = d.st.HandedOff(id)
	}
	// A copy held here is exported as a copy, whatever was asked: this
	// host never had the run to hand off.
	copyOnly := !handoff || wasOff && held.Copy
	if err == nil && !copyOnly && !wasOff {
		if err = d.st.HandOff(id, rec.Head()); err == nil {
			r.handedOff, r.exportedOnce = true, false
		}
	}
	if err == nil {
		r.exporting++
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.exporting--
		if copyOnly {
			return
		}
		if err == nil {
			r.exportedOnce = true
			if !wasOff {
				d.log.Info("run handed off", "run", id, "head", rec.Head())
				d.publish(api.Event{Kind: "run.handed_off", Run: id})
			}
			return
		}
		if r.handedOff && r.exporting == 0 && !r.exportedOnce {
			if rerr := d.st.Reclaim(id, rec.Head()); rerr != nil {
				d.log.Error("export failed and its handoff could not be taken back", "run", id, "err", rerr)
				return
			}
			r.handedOff = false
			d.log.Warn("export failed before its bundle was whole: the handoff is taken back", "run", id, "err", err)
		}
	}()
	objs, err := d.objectsOf(rec, true)
	if err != nil {
		return err
	}
	h := bundleHeader{Format: BundleFormat, Run: id, Objects: len(objs), Copy: copyOnly}
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
	return d.ImportWith(ctx, r, id, false)
}

// ImportWith is Import; with reclaim, a bundle of a run this host handed
// off that adds nothing to it (the very bundle exported) takes the run
// back: the operator's word that no other host resumed from it.
func (d *Daemon) ImportWith(ctx context.Context, r io.Reader, id string, reclaim bool) (api.Import, error) {
	if id != "" {
		if err := checkID(id); err != nil {
			return api.Import{}, err
		}
	}
	sb, err := bundle.Stage(ctx, d.st, r, bundle.Options{Limits: d.cfg.BundleLimits, Trusted: d.trusted, Policy: d.bundlePolicy(),
		Granted: d.heldElsewhere})
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
	rec := sb.Record
	// An export writes only parked runs: a bundle of an executing or
	// closed run is not one (it would arrive lost, or closable here).
	if rec.Phase() != record.Parked {
		return api.Import{}, fmt.Errorf("%w: the bundle's run is %s; a bundle carries a parked run", ErrBundle, rec.Phase())
	}
	rl := d.lock(id)
	defer rl.mu.Unlock()
	// One timeline per run: a bundle of a run held here is taken only over
	// the same id, only if this host handed the run off (or holds a copy),
	// and only if its record extends the one held (checked again as it is
	// stored); nothing is adopted before.
	extend := false
	if _, err := d.st.Run(id); err == nil {
		if err := d.st.CheckExtend(id, rec, reclaim); err != nil {
			return api.Import{}, err
		}
		extend = true
	} else if held, ok, err := d.st.RunOfGenesis(rec.Genesis()); err != nil {
		return api.Import{}, err
	} else if ok {
		return api.Import{}, fmt.Errorf("bundle of %s: %w: run %s", printableID(sb.Header.Run), store.ErrGenesisHeld, held)
	}
	if err := sb.Adopt(ctx, d.st); err != nil {
		return api.Import{}, err
	}
	// A copy is held as one in the same transaction that stores it. The
	// header's copy flag is not signed (docs/trust.md, "Copies").
	if extend {
		if _, err := d.st.Extend(id, rec, sb.Header.Copy, reclaim); err != nil {
			return api.Import{}, err
		}
	} else if err := d.st.ImportAs(id, rec, sb.Header.Copy); err != nil {
		return api.Import{}, err
	}
	d.fillCalls(id)
	sum, err := d.summary(id, rl)
	if err != nil {
		return api.Import{}, err
	}
	d.log.Info("run imported", "run", id, "from", sb.Header.Run, "objects", sb.Objects, "bytes", sb.Bytes, "copy", sb.Header.Copy)
	return api.Import{Run: sum, Objects: sb.Objects, Bytes: sb.Bytes, Grants: grantsOf(sb.Grants), Signers: d.signersOf(sb.Signers)}, nil
}

// printableID quotes a run id from a bundle for an error message.
func printableID(id string) string { return fmt.Sprintf("%q", id) }

// notHandedOff refuses an operation on a run an export handed to another
// host ([store.ErrHandedOff]).
func (d *Daemon) notHandedOff(id string) error {
	h, off, err := d.st.HandedOff(id)
	if err != nil {
		return err
	}
	switch {
	case off && h.Copy:
		return fmt.Errorf("run %s: %w: this host holds a copy (at %s), exported without a handoff; the run lives where it came from", id, store.ErrHandedOff, h.Head)
	case off:
		return fmt.Errorf("run %s: %w at %s: it runs there now; import a bundle of it from that host to take it back", id, store.ErrHandedOff, h.Head)
	}
	return nil
}

// heldElsewhere says whether this host holds the run of genesis g as
// handed off or as a copy: a bundle of it carries grants this host
// already granted.
func (d *Daemon) heldElsewhere(g record.Address) bool {
	id, ok, err := d.st.RunOfGenesis(g)
	if err != nil || !ok {
		return false
	}
	_, off, err := d.st.HandedOff(id)
	return err == nil && off
}
