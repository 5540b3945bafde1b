package bundle

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ExportOptions are what [Export] writes a bundle by.
type ExportOptions struct {
	// Record is the run's record as the caller read it under its lock on
	// the run ([Prepare] gives it); nil reads it from the store. It must
	// be parked.
	Record *record.Record
	// Copy marks the bundle a copy ("copy": true): the run was not handed
	// off, and an importing host holds it as a copy.
	Copy bool
}

// notParked is why a run in phase p is not exported.
func notParked(run string, p record.Phase) error {
	err := record.ErrNotParked
	if p == record.PhaseClosed {
		err = record.ErrClosed
	}
	return fmt.Errorf("export: run %s: %w: only a parked run can be exported (park it first)", run, err)
}

// Exportable says whether run can be exported: only a parked run can. A
// bundle hands a run to another host to resume, and only a parked run has
// a snapshot to resume from; an executing run exported would arrive with
// nothing to resume and no sandbox (lost), and a closed one has nothing
// left to hand over (its record is served as it is). A run that lacks
// slabs a post-copy migration owes it is not exported until it holds
// them (store.ErrOwed).
func Exportable(st Runs, run string) error {
	r, err := st.Run(run)
	if err != nil {
		return err
	}
	if r.Phase != record.PhaseParked {
		return notParked(run, r.Phase)
	}
	if o, ok := st.(interface{ Owes(id string) error }); ok {
		// A post-copy migration still brings its slabs in
		// (store.ErrOwed): a bundle would lack them.
		return o.Owes(run)
	}
	return nil
}

// HeldHere refuses, with [store.ErrHandedOff], an operation on a run this
// host does not hold: one handed off by an export, or held as a copy. The
// run lives elsewhere until a bundle extending its record comes back.
func HeldHere(st Runs, run string) error {
	h, off, err := st.HandedOff(run)
	if err != nil {
		return err
	}
	switch {
	case off && h.Copy:
		return fmt.Errorf("run %s: %w: this host holds a copy (at %s), exported without a handoff; the run lives where it came from", run, store.ErrHandedOff, h.Head)
	case off:
		return fmt.Errorf("run %s: %w at %s: it runs there now; import a bundle of it from that host to take it back", run, store.ErrHandedOff, h.Head)
	}
	return nil
}

// Prepare decides run's export, and is called under the caller's lock on
// the run, so that nothing comes between reading its record and handing it
// off: the record is read, and must be parked; with handoff the run is
// handed off at its head ([store.Store.HandOff]) unless it is handed off
// already. A run this host holds as a copy is exported as a copy whatever
// was asked: this host never had the run to hand off. Prepare returns the
// options [Export] writes the bundle by, and whether it made the handoff:
// the caller takes that back ([store.Store.Reclaim]) if no bundle is
// delivered whole.
func Prepare(st Runs, run string, handoff bool) (_ ExportOptions, made bool, _ error) {
	rec, err := st.Record(run)
	if err != nil {
		return ExportOptions{}, false, err
	}
	if rec.Phase() != record.PhaseParked {
		return ExportOptions{}, false, notParked(run, rec.Phase())
	}
	held, off, err := st.HandedOff(run)
	if err != nil {
		return ExportOptions{}, false, err
	}
	o := ExportOptions{Record: rec, Copy: !handoff || off && held.Copy}
	if o.Copy || off {
		return o, false, nil
	}
	if err := st.HandOff(run, rec.Head()); err != nil {
		return ExportOptions{}, false, err
	}
	return o, true, nil
}

// Reached returns every object rec reaches — its unit spec and grant set,
// every object a segment names, and what those declared as refs in st —
// ordered so that each object comes after the objects it refers to (the
// order a bundle carries them in, and an importer stores them in). The
// unit spec and grant set come first, then each segment's objects in
// record order; an object is listed once. Without images, image snapshots
// are left out: those of a closed run whose snapshots were released.
func Reached(st Objects, rec *record.Record, images bool) ([]record.Address, error) {
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
		refs, err := st.Refs(a)
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

// Export writes run's bundle to w in [Format] (docs/bundle.md): a tar of
// bundle.json (indented by two spaces), record.json (the record's wire
// form) and every object the record reaches ([Reached]), each after the
// objects it refers to — those of at most [PackObject] bytes packed, many
// to a pack/N member, the others as objects/<address> — every member mode
// 0444 with no owner or time. Objects are read verified, so a damaged store fails the export
// rather than shipping bad bytes; a failed export has written a bundle
// that is not whole, which an import refuses.
//
// Export hands nothing off: [Prepare] does, under the caller's lock, and
// the objects of a parked record never change, so they are streamed
// without it.
func Export(ctx context.Context, st Store, run string, w io.Writer, opts ExportOptions) error {
	rec := opts.Record
	if rec == nil {
		var err error
		if rec, err = st.Record(run); err != nil {
			return err
		}
	}
	if rec.Phase() != record.PhaseParked {
		return notParked(run, rec.Phase())
	}
	objs, err := Reached(st, rec, true)
	if err != nil {
		return err
	}
	h := Header{Format: Format, Run: run, Objects: len(objs), Copy: opts.Copy}
	sized := make([]sizedObject, len(objs))
	for i, a := range objs {
		sized[i].addr = a
		if sized[i].size, err = st.Size(a); err != nil {
			return err
		}
		h.Bytes += sized[i].size
	}
	tw := tar.NewWriter(w)
	hb, _ := json.MarshalIndent(h, "", "  ")
	if err := writeMember(tw, "bundle.json", hb); err != nil {
		return err
	}
	if err := writeMember(tw, "record.json", rec.EncodeWire()); err != nil {
		return err
	}
	if err := writeObjects(ctx, tw, st, run, sized); err != nil {
		return err
	}
	return tw.Close()
}

// sizedObject is an object an export writes, with its size.
type sizedObject struct {
	addr record.Address
	size int64
}

// writeObjects writes objs in their order: each run of consecutive
// objects of at most [PackObject] bytes as pack members of at most
// [PackMax] bytes (pack/0, pack/1, ...), each larger object as a member
// objects/<address>.
func writeObjects(ctx context.Context, tw *tar.Writer, st Objects, run string, objs []sizedObject) error {
	packs := 0
	for i := 0; i < len(objs); {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !packed(objs[i].size) {
			name := "objects/" + strings.TrimPrefix(objs[i].addr.String(), record.AddressPrefix)
			if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o444, Size: objs[i].size, Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			if err := copyObject(tw, st, run, objs[i].addr); err != nil {
				return err
			}
			i++
			continue
		}
		j, size := i, int64(0)
		for ; j < len(objs) && packed(objs[j].size) && size+frame(objs[j].size) <= PackMax; j++ {
			size += frame(objs[j].size)
		}
		if err := tw.WriteHeader(&tar.Header{Name: packName(packs), Mode: 0o444, Size: size, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		for ; i < j; i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			if _, err := tw.Write(binary.AppendUvarint(nil, uint64(objs[i].size))); err != nil {
				return err
			}
			if err := copyObject(tw, st, run, objs[i].addr); err != nil {
				return err
			}
		}
		packs++
	}
	return nil
}

// copyObject copies object a, read verified, to w.
func copyObject(w io.Writer, st Objects, run string, a record.Address) error {
	rd, err := st.Open(a)
	if err != nil {
		return err
	}
	defer rd.Close()
	if _, err := io.Copy(w, rd); err != nil {
		return fmt.Errorf("export %s: object %s: %w", run, a, err)
	}
	return nil
}

func writeMember(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o444, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}
