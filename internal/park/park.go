// Package park turns a running sandbox into stored objects and back: the
// image park (a CRIU checkpoint of the task plus its rw layer, each
// ingested as a directory object) and the transcript park (the unit's
// transcript file as one object), and, for a resume, the snapshot actually
// offered by the bytes on disk and the trees a restore reads. It composes
// store calls ([store.Store.IngestHashed], [store.Store.RehashDir],
// [store.Store.Materialize]) and never reads or links the store's files
// itself.
//
// Before an image park, [Room] says whether there is room for it: the
// store's filesystem must keep a minimum free after the dump, and the
// run's snapshots must stay within its quota (docs/limits.md); a refusal
// is [ErrNoSpace], and what is left is the budget of the park's rw layer.
// [Result.Checkpointed] is a park's statistics as the journal keeps them.
//
// # Order
//
// [Image] checkpoints with the task left frozen ([executor.Checkpoint.Keep])
// and ingests both trees before it returns; the caller then appends the
// park's segments and only after that destroys the sandbox. A failure in
// Image thaws the task, so it keeps running and nothing is recorded. A
// crash after Image leaves durable, unreferenced objects (collected by the
// store's GC) and a frozen task that the daemon thaws when it reconciles.
//
// # Hashing while CRIU writes
//
// Image follows the image directory while CRIU dumps into it: each file of
// 1 MiB or more is hashed as it grows and its writeback started, so that
// when the checkpoint returns little is left but the naming, and the
// ingest ([store.Store.IngestHashed]) takes those hashes instead of reading
// the files again. That relies on CRIU writing each image file once, by
// appending. A followed file seen to shrink, to be replaced, or to change
// once it had reached its final size is hashed again by the ingest; a
// rewrite of bytes already hashed while the file still grew could not be
// seen, and would store the file under a wrong address, which [Offered]
// and the store's verification report. A chunked park's follower also
// hashes the pages files' chunks while it waits for CRIU (early.go). With
// a base holding chunks, it neither hashes its pages files whole nor
// starts their writeback: their chunks are mostly held already, and the staged file,
// removed once the rest are in a new slab, then goes without waiting for
// the disk.
//
// # Layout of an image park
//
// The snapshot's root is a directory object holding one file, rootfs.tar:
// the rw layer's diff against the image in OCI layer form. Its memory is a
// directory object holding CRIU's image directory as CRIU wrote it, or,
// when the store keeps images chunked (store.Store.ChunkedImages, serve
// --chunked-images), with each pages file of 1 MiB or more in the slab
// form: 16 KiB chunks by virtual address ([ChunkSize]) in slabs, with an
// index (store.ChunkedFiles). A first park's slab is the pages file,
// renamed; a later one lists the chunks its base's slabs hold there and
// writes the rest as one new slab ([store.Store.IngestChunks]). [Layout]
// lays the pages file out again, after checking the chunks against its
// pagemap: the slab linked when it is the file, else copied in the
// kernel. docs/chunked-images.md.
package park

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// RootfsName is the file an image park's root directory object holds.
const RootfsName = "rootfs.tar"

// Checkpointer is the part of a sandbox an image park uses.
type Checkpointer interface {
	Checkpoint(ctx context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error)
	// Settle puts the unit back to running by its task's real state
	// (thawed if frozen), after a park that did not go through.
	Settle(ctx context.Context) error
}

// Result is an image park's outcome.
type Result struct {
	Snapshot record.Snapshot
	// Retained is the bytes the snapshot holds in the store: both
	// listings and every file they name.
	Retained int64
	Stats    executor.CheckpointStats
	// Ingest is the time from the checkpoint's return until both trees
	// are stored: what the checkpoint left of the hashing and the
	// writeback, and the naming.
	Ingest time.Duration
	// Followed is the bytes of the memory image hashed while CRIU wrote
	// it, not after the checkpoint returned.
	Followed int64
	// Chunks is what the chunking of the pages files found, when the
	// store keeps images chunked (store.Store.ChunkedImages).
	Chunks ChunkStats
	// NewBytes is the bytes of files and chunks the park added to the
	// store (besides the two listings); the rest it held already.
	NewBytes int64
}

// Checkpointed is the park's CRIU statistics and ingest time as the replay
// journal keeps them.
func (r Result) Checkpointed() attest.Checkpointed {
	s := r.Stats
	return attest.Checkpointed{
		TotalNS: int64(s.Total), PauseNS: int64(s.Pause), DumpNS: int64(s.Dump), DiffNS: int64(s.Diff),
		FreezingNS: int64(s.Freezing), FrozenNS: int64(s.Frozen), MemDumpNS: int64(s.MemDump), MemWriteNS: int64(s.MemWrite),
		Pages: s.PagesWritten, PagesScan: s.PagesScanned, ImageBytes: s.ImageBytes, RootBytes: s.RootfsBytes,
		IngestNS: int64(r.Ingest),
	}
}

// ImageOptions are how [Image] parks.
type ImageOptions struct {
	// Deadline bounds CRIU's dump (0: none).
	Deadline time.Duration
	// MaxRootfs, when positive, lowers the rw layer's budget
	// (executor.Checkpoint.MaxRootfsBytes): what is left of the run's
	// snapshot quota and of the store's free space.
	MaxRootfs int64
	// Base is the memory image of the run's last image park, if any: a
	// chunked park lists the chunks its slabs hold, unchanged, in them.
	Base *record.Address
	// Kin names the runs whose parks may share slabs with this one (the
	// daemon's: the key the run is booked to and its unit's image); empty:
	// none. Without a Base, a chunked park takes the chunks it shares
	// with the newest park of its kin that this process made ([kin]) of
	// a run not closed. Run is the run parked, which the kin's park names.
	Kin, Run string
}

// Image checkpoints sb into staging directories on st's filesystem, leaving
// its task frozen, and ingests the CRIU images and the rw layer as directory
// objects. On error the task is settled (running as it was) and nothing
// of the park remains but collectable objects.
func Image(ctx context.Context, st *store.Store, sb Checkpointer, opt ImageOptions) (Result, error) {
	deadline, maxRootfs := opt.Deadline, opt.MaxRootfs
	var res Result
	mem, err := st.StagingDir("criu")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(mem)
	root, err := st.StagingDir("rootfs")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(root)
	images := filepath.Join(mem, "images")
	chunked := st.ChunkedImages()
	// The chunks the base's slabs hold, or the kin's, are found while
	// CRIU dumps.
	var held based
	found := make(chan struct{})
	from, donor := opt.Base, false
	if chunked && from == nil && opt.Kin != "" {
		if mem, ok := kin.get(st, opt.Kin); ok {
			from, donor = &mem, true
		}
	}
	if chunked && from != nil {
		go func() {
			defer close(found)
			files := baseFiles(st, from)
			if donor && touchSlabs(st, files) != nil {
				return // collected: the park stores every chunk
			}
			held = heldChunks(files, made.has(st, *from))
			held.kin = donor
		}()
	} else {
		close(found)
	}
	fo := followOptions{least: followMin, chunks: chunked}
	if chunked && from != nil {
		// Pages files are later ones if the base holds chunks: else
		// they are likely stored as they are, as slab 00.
		fo.later = func(name string) bool {
			if !isPages(name) {
				return false
			}
			<-found
			return len(held.held) > 0
		}
	}
	fl := follow(ctx, images, fo)
	defer func() { <-found }()
	res.Stats, err = sb.Checkpoint(ctx, executor.Checkpoint{ImageDir: images, Rootfs: filepath.Join(root, RootfsName), Keep: true, Deadline: deadline, MaxRootfsBytes: maxRootfs})
	if err != nil {
		fl.stop()
		// The executor settles the task after any failure of its own;
		// settling again goes by the task's state, so it costs nothing
		// and holds for any Checkpointer.
		return res, errors.Join(err, thaw(sb))
	}
	start := time.Now()
	// The rw layer is stored beside the memory image: its syncs and
	// commit overlap the chunking, and the answer waits for both. Its
	// ingest syncs the filesystem, so in a park whose base holds chunks
	// it starts once the chunks are put: the staged pages files are
	// removed then, mostly held already, and a syncfs before would write
	// them back for nothing (561 MB of a 512 MiB unit's later park here,
	// and the removal then waited for that writeback). A park that
	// fails first does not start it.
	type ingested struct {
		addr record.Address
		st   store.IngestStats
		err  error
	}
	rootDone := make(chan ingested, 1)
	rootStarted := false
	ingestRoot := func() {
		if rootStarted {
			return
		}
		rootStarted = true
		go func() {
			var in ingested
			in.addr, in.st, in.err = ingestRootfs(ctx, st, root)
			rootDone <- in
		}()
	}
	rootIn := sync.OnceValue(func() ingested { ingestRoot(); return <-rootDone })
	defer func() { // before the staging directory goes
		if rootStarted {
			rootIn()
		}
	}()
	// The chunks the follower did not hash early are hashed now, while
	// it hashes the tail of the files it follows whole; the early hashes
	// of a file it does not vouch for then are made again.
	fl.producerReturned()
	if <-found; len(held.held) == 0 {
		ingestRoot()
	}
	var plans []*slabber
	planned := make(chan error, 1)
	if chunked {
		go func() {
			<-found
			var err error
			plans, err = planChunks(ctx, st, images, held, fl.chunksSoFar)
			planned <- err
		}()
	} else {
		planned <- nil
	}
	known, fst := fl.finish()
	res.Followed = fst.Early
	if err := <-planned; err != nil {
		return res, errors.Join(err, thaw(sb))
	}
	for _, c := range plans {
		if err := c.vouched(ctx, fl.earlyChunks(c.name)); err != nil {
			return res, errors.Join(fmt.Errorf("park: chunking %s: %w", c.name, err), thaw(sb))
		}
	}
	var stored []store.Entry
	if len(plans) > 0 {
		if known == nil {
			known = map[string]store.Hashed{}
		}
		if stored, res.Chunks, err = putChunks(plans, known); err != nil {
			return res, errors.Join(err, thaw(sb))
		}
	}
	ingestRoot()
	memAddr, mst, err := st.IngestChunks(ctx, images, known, stored)
	if err != nil {
		return res, errors.Join(fmt.Errorf("park: storing the memory image: %w", err), thaw(sb))
	}
	if len(plans) > 0 {
		made.put(st, memAddr)
		if opt.Kin != "" {
			kin.put(st, opt.Kin, kinPark{memAddr, opt.Run})
		}
	}
	ri := rootIn()
	if ri.err != nil {
		return res, errors.Join(fmt.Errorf("park: storing the rw layer: %w", ri.err), thaw(sb))
	}
	rootAddr, rst := ri.addr, ri.st
	res.Ingest = time.Since(start)
	res.NewBytes = mst.NewBytes + rst.NewBytes
	res.Snapshot = record.ImageSnapshot(rootAddr, &memAddr)
	res.Retained = mst.Bytes + rst.Bytes + size(st, memAddr) + size(st, rootAddr)
	return res, nil
}

// ingestRootfs stores a park's rw layer (a variable: tests see when).
var ingestRootfs = func(ctx context.Context, st *store.Store, dir string) (record.Address, store.IngestStats, error) {
	return st.Ingest(ctx, dir)
}

// baseFiles are the chunked files of memory image base, if it is one the
// store holds and reads: else none, and the park stores every chunk.
func baseFiles(st *store.Store, base *record.Address) []store.ChunkedFile {
	if base == nil {
		return nil
	}
	es, err := st.Listing(*base)
	if err != nil {
		return nil
	}
	cfs, _ := store.ChunkedFiles(es, st.ReadIndex)
	return cfs
}

// touchSlabs touches the slabs files list (store.Store.Touch), so that
// no collection takes one before the park's ingest names it: a kin's
// snapshots may be released meanwhile, unlike the run's own base.
func touchSlabs(st *store.Store, files []store.ChunkedFile) error {
	var slabs []record.Address
	for _, cf := range files {
		for _, e := range cf.Slabs {
			slabs = append(slabs, e.Address)
		}
	}
	return st.Touch(slabs...)
}

func thaw(sb Checkpointer) error {
	// The caller's context may be what failed; thawing must still happen.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.Settle(ctx); err != nil {
		return fmt.Errorf("park: settling the unit after a failed park: %w", err)
	}
	return nil
}

func size(st *store.Store, a record.Address) int64 {
	n, _ := st.Size(a)
	return n
}

// Transcript seals the transcript file at path as an object and returns
// its transcript-form snapshot and size.
func Transcript(ctx context.Context, st *store.Store, path string) (record.Snapshot, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return record.Snapshot{}, 0, fmt.Errorf("park: transcript: %w", err)
	}
	defer f.Close()
	a, err := st.Put(ctx, f)
	if err != nil {
		return record.Snapshot{}, 0, fmt.Errorf("park: transcript: %w", err)
	}
	return record.TranscriptSnapshot(a), size(st, a), nil
}

// Retained returns the bytes a snapshot holds in st: each object it names
// and, for a directory object, every file its listing names.
func Retained(st *store.Store, snap record.Snapshot) (int64, error) {
	var n int64
	for _, a := range snap.Addresses() {
		sz, err := st.Size(a)
		if err != nil {
			return 0, err
		}
		n += sz
		if snap.IsTranscript() {
			continue
		}
		es, err := st.Listing(a)
		if err != nil {
			return 0, err
		}
		for _, e := range es {
			n += int64(e.Size)
		}
	}
	return n, nil
}

// Offered returns the snapshot that the bytes stored for recorded hash to
// now ([store.Store.Rehash], [store.Store.RehashDir]): each object is
// rehashed from disk, and a directory object's address is recomputed from
// a listing rebuilt over its files' current hashes. An intact snapshot is
// offered as itself; a flipped byte anywhere makes a different snapshot,
// which the first resume precondition refuses. A file that is missing
// altogether is an error wrapping store.ErrMissingObject.
func Offered(ctx context.Context, st *store.Store, recorded record.Snapshot) (record.Snapshot, error) {
	if recorded.IsTranscript() {
		a, err := st.Rehash(ctx, *recorded.Transcript)
		if err != nil {
			return record.Snapshot{}, fmt.Errorf("park: %w", err)
		}
		return record.TranscriptSnapshot(a), nil
	}
	root, err := st.RehashDir(ctx, *recorded.Root)
	if err != nil {
		return record.Snapshot{}, fmt.Errorf("park: %w", err)
	}
	var mem *record.Address
	if recorded.Memory != nil {
		m, err := st.RehashDir(ctx, *recorded.Memory)
		if err != nil {
			return record.Snapshot{}, fmt.Errorf("park: %w", err)
		}
		mem = &m
	}
	return record.ImageSnapshot(root, mem), nil
}

// Trees are the files a restore reads, laid out from a snapshot.
type Trees struct {
	ImageDir string // CRIU's image directory
	Rootfs   string // the rw layer tar
}

// Layout lays an image snapshot's trees out under dir (which must not
// exist) by hard links to the stored objects: no bytes move, except that a
// chunked pages file that is not one slab holding it in order is written
// from its chunks (copy_file_range); the chunks must cover exactly the
// present pages of its pagemap (else store.ErrChunks).
// Call it only after [Offered] found the snapshot intact; it does not hash
// again ([store.LinkRehashed]).
func Layout(st *store.Store, snap record.Snapshot, dir string) (Trees, error) {
	if snap.IsTranscript() || snap.Root == nil || snap.Memory == nil {
		return Trees{}, fmt.Errorf("park: %s is not an image park with a memory image", snap)
	}
	t := Trees{ImageDir: filepath.Join(dir, "images"), Rootfs: filepath.Join(dir, "root", RootfsName)}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Trees{}, fmt.Errorf("park: %w", err)
	}
	// Nothing is hashed, so there is nothing to cancel.
	ctx := context.Background()
	if err := st.Materialize(ctx, *snap.Memory, t.ImageDir, store.LinkRehashed); err != nil {
		os.RemoveAll(dir)
		return Trees{}, fmt.Errorf("park: %w", err)
	}
	if err := assemble(st, *snap.Memory, t.ImageDir); err != nil {
		os.RemoveAll(dir)
		return Trees{}, fmt.Errorf("park: %w", err)
	}
	if err := st.Materialize(ctx, *snap.Root, filepath.Dir(t.Rootfs), store.LinkRehashed); err != nil {
		os.RemoveAll(dir)
		return Trees{}, fmt.Errorf("park: %w", err)
	}
	if _, err := os.Stat(t.Rootfs); err != nil {
		os.RemoveAll(dir)
		return Trees{}, fmt.Errorf("park: root %s holds no %s: %w", *snap.Root, RootfsName, err)
	}
	return t, nil
}
