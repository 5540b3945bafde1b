//go:build linux

package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// postCopyHosts starts a source (chunked parks, so its memory images are
// slabs) and a post-copy target (served lazy resume, post-copy on), each
// with the oracle's image and leases of ttl; the source waits wait for
// its post-copy targets when it stops.
func postCopyHosts(t *testing.T, f *fleetEnv, ttl, wait string) (a, b *daemon, keyA, keyB string) {
	t.Helper()
	a, keyA = f.start(t, t.Name()+"-a", append(f.flags(), "--lease-ttl", ttl, "--chunked-images", "--post-copy-wait", wait))
	mustImportImage(t, a, oracleArchive, oracleImage, oracleDigest)
	b, keyB = f.start(t, t.Name()+"-b", append(f.flags(), "--lease-ttl", ttl, "--lazy-resume", "--lazy-served", "--post-copy"))
	mustImportImage(t, b, oracleArchive, oracleImage, oracleDigest)
	return a, b, keyA, keyB
}

// waitLog waits until d's log says what, or fails after 90 s.
func waitLog(t *testing.T, d *daemon, what string) {
	t.Helper()
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if strings.Contains(d.logTail(), what) {
			return
		}
	}
	t.Fatalf("the %s daemon's log never said %q:\n%s", d.name, what, d.logTail())
}

// waitOwing waits until d's GET /v1/host lists run id owing slabs from
// host source, its fetch in state (waiting: with the last try's error),
// or fails after 90 s.
func waitOwing(t *testing.T, d *daemon, id, source, state string) {
	t.Helper()
	var last []api.PostCopyOwing
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		h, err := d.c.Host(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		last = h.PostCopyOwings
		if len(last) == 1 && last[0].Run == id && last[0].Source == source && last[0].Slabs > 0 && last[0].State == state && (state != "waiting" || last[0].Reason != "") {
			return
		}
	}
	t.Fatalf("the %s daemon's owings: %+v; want %s from %s, %s", d.name, last, id, source, state)
}

// verifiedWhole checks that run id's record verifies on every daemon of
// ds, owing no slab.
func verifiedWhole(t *testing.T, id string, ds ...*daemon) {
	t.Helper()
	for _, d := range ds {
		if v, err := d.c.Verify(context.Background(), id); err != nil || !v.OK || v.Owed != 0 {
			t.Fatalf("verify on the %s daemon: %+v, %v", d.name, v, err)
		}
	}
}

// TestFleetPostCopyParked: a parked oracle whose park is in the slab form
// migrates to a post-copy target (docs/fleet.md, "Post-copy"): the target
// stores and claims it before its memory slabs are there, answers, brings
// them in from the source, and tells it; the source's hold then ends. The
// run resumes on the target as the same process, its memory what it was
// (the oracle's checksum), and its record verifies on both hosts.
func TestFleetPostCopyParked(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, b, _, keyB := postCopyHosts(t, f, "10s", "30s")
	const id = "postcopy"
	startOracle(t, a, id, oracleImage)
	closeAtEnd(t, b, id)
	_, atPark := park(t, a, id)
	onA := output(t, a.stdout(id))
	if _, err := a.c.Migrate(ctx, id, keyB); err != nil {
		t.Fatalf("migrate: %v\n%s", err, a.logTail())
	}
	waitLog(t, b, "post-copy: every slab of the run is here")
	waitLog(t, a, "post-copy: the target holds the run; its hold here ends")
	verifiedWhole(t, id, a, b)
	resume(t, b, id, onA, atPark)
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK {
		t.Fatalf("verify on the target after the resume: %+v, %v", v, err)
	}
}

// TestFleetPostCopySourceDown: the target dies once it stored and claimed
// a post-copy run (failpoint receive.owing), before it fetched a slab; the
// source's migrate fails, the run the target's. The source lists the hold
// (GET /v1/host); once the target read nothing of the run for
// member.FetchIdle, the source, stopped, does not wait its
// --post-copy-wait (30 s) for it and stops with the run held. The target,
// started again,
// holds the run owing its slabs: its resume, export and migration onward
// are refused unavailable, its record verifies, GET /v1/host (and the
// run's verify) lists the run owing, its fetch waiting with the last
// try's error. Once the source is
// back, serving the run from its durable hold, the target fetches the
// slabs, tells the source (whose hold ends), and resumes the oracle as
// the same process.
func TestFleetPostCopySourceDown(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, b, keyA, keyB := postCopyHosts(t, f, "60s", "30s")
	const id = "postcopy-down"
	startOracle(t, a, id, oracleImage)
	closeAtEnd(t, b, id)
	_, atPark := park(t, a, id)
	onA := output(t, a.stdout(id))

	failed, _ := handOverToDead(t, a, b, id, keyB)
	time.Sleep(time.Until(failed.Add(member.FetchIdle)))
	began := time.Now()
	mustStop(t, a)
	if took := time.Since(began); took > 15*time.Second {
		t.Fatalf("the source stopped in %v, waiting its --post-copy-wait for a hold whose target fetches nothing", took)
	}
	f.restartKilled(t, b, keyB)

	_, err := b.c.Resume(ctx, id)
	apiError(t, err, api.CodeUnavailable)
	var buf bytes.Buffer
	apiError(t, b.c.ExportCopy(ctx, id, &buf), api.CodeUnavailable)
	_, err = b.c.Migrate(ctx, id, keyA)
	apiError(t, err, api.CodeUnavailable)
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK || v.Owed == 0 {
		t.Fatalf("verify on the target owing slabs: %+v, %v; want ok, owing slabs", v, err)
	}
	waitOwing(t, b, id, keyA, "waiting")
	if v, err := b.c.Verify(ctx, id); err != nil || v.Owing == nil || v.Owing.Source != keyA || v.Owing.Slabs != v.Owed {
		t.Fatalf("verify on the target owing slabs: %+v, %v; want its owing from %s", v, err, keyA)
	}

	mustStart(t, a)
	waitLog(t, b, "post-copy: every slab of the run is here")
	waitLog(t, a, "post-copy: the target holds the run; its hold here ends")
	resume(t, b, id, onA, atPark)
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK || v.Owed != 0 {
		t.Fatalf("verify on the target: %+v, %v; want ok, owing nothing", v, err)
	}
}

// TestFleetPostCopyCrash: the post-copy target is killed (kill -9) at
// each step of its fill (failpoint.PostCopySteps after the first): a slab
// adopted and not settled, then every slab settled and the source told
// but the owing not ended. Started again, it goes on: it settles the
// adopted slab (kept by the collection meanwhile), tells the source again
// (a no-op there once its hold ended), ends the owing; the source's hold
// ends, both records verify, and the oracle resumes on the target as the
// same process.
func TestFleetPostCopyCrash(t *testing.T) {
	privileged(t)
	for _, step := range failpoint.PostCopySteps[1:] {
		t.Run(step, func(t *testing.T) {
			ctx := context.Background()
			f := fleetCluster(t)
			a, b, _, keyB := postCopyHosts(t, f, "60s", "2s")
			const id = "postcopy-crash"
			startOracle(t, a, id, oracleImage)
			closeAtEnd(t, b, id)
			_, atPark := park(t, a, id)
			onA := output(t, a.stdout(id))
			mustStop(t, b)
			b.env = []string{failpoint.Env + "=" + step}
			mustStart(t, b)
			// The fill may reach the step before the answer: the target
			// claimed the run either way.
			_, _ = a.c.Migrate(ctx, id, keyB)
			crashKilled(t, b, step)
			b.env = nil
			f.restartKilled(t, b, keyB)
			waitLog(t, b, "post-copy: every slab of the run is here")
			waitLog(t, a, "post-copy: the target holds the run; its hold here ends")
			if h, err := a.c.Host(ctx); err != nil || len(h.PostCopyHolds) != 0 {
				t.Fatalf("the source's holds: %+v, %v; want none", h.PostCopyHolds, err)
			}
			verifiedWhole(t, id, a, b)
			resume(t, b, id, onA, atPark)
		})
	}
}

// TestFleetPostCopyNotHeld: the source's hold on a run ends while its
// post-copy target still owes every slab (here: dropped in the stopped
// source's store, as its expiry would; the target died once it claimed
// the run, failpoint receive.owing). Both started again, the target asks
// the source (POST /v1/migrations/held), which answers false: the owing
// is stranded, logged once, and never tried again. GET /v1/host and the
// run's verify list it stranded with the reason, the record verifies,
// and its resume, export and migration onward are refused not_held. A
// close of the run ends the owing; both records verify.
func TestFleetPostCopyNotHeld(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, b, keyA, keyB := postCopyHosts(t, f, "60s", "30s")
	const id = "postcopy-not-held"
	startOracle(t, a, id, oracleImage)
	closeAtEnd(t, b, id)
	park(t, a, id)

	failed, h := handOverToDead(t, a, b, id, keyB)
	target, err1 := record.ParseAddress(h.PostCopyHolds[0].Target)
	head, err2 := record.ParseAddress(h.PostCopyHolds[0].Head)
	if err1 != nil || err2 != nil {
		t.Fatalf("the hold's target and head: %v, %v", err1, err2)
	}
	time.Sleep(time.Until(failed.Add(member.FetchIdle)))
	mustStop(t, a)
	st, err := store.Open(filepath.Join(a.state, "store"))
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := st.DropHold(id, target, head)
	if cerr := st.Close(); err != nil || cerr != nil || !dropped {
		t.Fatalf("dropping the source's hold: %v, %v, %v", dropped, err, cerr)
	}
	mustStart(t, a)
	f.restartKilled(t, b, keyB)

	waitOwing(t, b, id, keyA, "stranded")
	waitLog(t, b, "post-copy: the run's owing is stranded")
	_, err = b.c.Resume(ctx, id)
	apiError(t, err, api.CodeNotHeld)
	var buf bytes.Buffer
	apiError(t, b.c.ExportCopy(ctx, id, &buf), api.CodeNotHeld)
	_, err = b.c.Migrate(ctx, id, keyA)
	apiError(t, err, api.CodeNotHeld)
	v, err := b.c.Verify(ctx, id)
	if err != nil || !v.OK || v.Owed == 0 || v.Owing == nil || v.Owing.State != "stranded" || !strings.Contains(v.Owing.Reason, "held: false") {
		t.Fatalf("verify on the target of a stranded owing: %+v (owing %+v), %v; want ok, stranded for held: false", v, v.Owing, err)
	}
	if n := strings.Count(b.logTail(), "post-copy: the run's owing is stranded"); n != 1 {
		t.Fatalf("the strand logged %d times, want once:\n%s", n, b.logTail())
	}

	if _, err := b.c.Close(ctx, id, "e2e: its source holds it no more"); err != nil {
		t.Fatalf("close of a stranded run: %v", err)
	}
	waitLog(t, b, "post-copy: the run is closed; its owed slabs are not brought in")
	if h, err := b.c.Host(ctx); err != nil || len(h.PostCopyOwings) != 0 {
		t.Fatalf("the target's owings after the close: %+v, %v; want none", h.PostCopyOwings, err)
	}
	verifiedWhole(t, id, a, b)
}

// handOverToDead migrates run id from a to b (host key keyB), b armed to
// die at failpoint.PostCopySteps[0] (the run claimed and owing, nothing
// answered): migrate fails and a holds the run for b. It returns when the
// migrate failed, and a's host answer.
func handOverToDead(t *testing.T, a, b *daemon, id, keyB string) (time.Time, api.Host) {
	t.Helper()
	step := failpoint.PostCopySteps[0]
	mustStop(t, b)
	b.env = []string{failpoint.Env + "=" + step}
	mustStart(t, b)
	out, err := exec.Command(daemonBinary, "migrate", id, "--to", keyB, "--socket", a.socket).CombinedOutput()
	if err == nil {
		t.Fatalf("migrate answered though the target died: %s", out)
	}
	failed := time.Now()
	crashKilled(t, b, step)
	b.env = nil
	h, err := a.c.Host(context.Background())
	if err != nil || len(h.PostCopyHolds) != 1 || h.PostCopyHolds[0].Run != id || h.PostCopyHolds[0].Target != keyB {
		t.Fatalf("the source's holds: %+v, %v; want %s held for %s", h.PostCopyHolds, err, id, keyB)
	}
	return failed, h
}

// postCopyRunning is postCopyHosts with the oracle id running on the
// source, its first line verified; the target armed with failpoint fault
// when one is given.
func postCopyRunning(t *testing.T, id, wait, fault string) (a, b *daemon, keyB string) {
	t.Helper()
	f := fleetCluster(t)
	a, b, _, keyB = postCopyHosts(t, f, "10s", wait)
	if fault != "" {
		mustStop(t, b)
		b.env = []string{failpoint.Env + "=" + fault}
		mustStart(t, b)
	}
	startOracle(t, a, id, oracleImage)
	closeAtEnd(t, b, id)
	waitLines(t, a.stdout(id), "the oracle's first verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt > 0 })
	return a, b, keyB
}

// migrateExecuting migrates running oracle id from a to b (keyB) and
// returns the oracle's lines on a and the last of them, written before
// the migration's park.
func migrateExecuting(t *testing.T, a *daemon, id, keyB string) ([]line, line) {
	t.Helper()
	if _, err := a.c.Migrate(context.Background(), id, keyB); err != nil {
		t.Fatalf("migrate: %v\n%s", err, a.logTail())
	}
	onA := output(t, a.stdout(id))
	if len(onA) == 0 {
		t.Fatal("the oracle wrote nothing on the source")
	}
	return onA, last(onA)
}

// TestFleetPostCopyExecuting: a running oracle migrates to a post-copy
// target (docs/fleet.md, "Post-copy"). The source parks it, its memory
// in the slab form; the target stores and claims the run owing the
// slabs, and resumes it lazily before one of them is here: its page
// server has each chunk fetched from the source, verified, before it
// serves it, while the background fetch brings the rest in and tells the
// source. The oracle goes on on the target as the same process, its
// memory what it was; then every page is resident, the owing ends, the
// source's hold ends, and both records verify. A park and resume on the
// target find it whole.
func TestFleetPostCopyExecuting(t *testing.T) {
	privileged(t)
	const id = "postcopy-exec"
	a, b, keyB := postCopyRunning(t, id, "30s", "")
	onA, atPark := migrateExecuting(t, a, id, keyB)
	waitLog(t, b, "post-copy=true")
	ls := waitLines(t, b.stdout(id), "a line verified on the target", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atPark.Counter
	})
	if first := ls[0]; first.Counter != atPark.Counter+1 || first.Pid != atPark.Pid || first.StartTime != atPark.StartTime || first.Checksum != atPark.Checksum {
		t.Fatalf("first line on the target %+v; last on the source %+v", first, atPark)
	}
	checkOneProcess(t, append(append([]line(nil), onA...), ls...))
	s := waitRestore(t, b, id, "every page resident", func(rs *api.Restore) bool { return rs.ResidentNS > 0 })
	if !s.Restore.Lazy || !s.Restore.Served {
		t.Fatalf("the target's restore %+v, want lazy and served", s.Restore)
	}
	waitLog(t, b, "post-copy: every slab of the run is here")
	waitLog(t, a, "post-copy: the target holds the run; its hold here ends")
	verifiedWhole(t, id, a, b)
	_, again := park(t, b, id)
	resume(t, b, id, onA, again)
}

// TestFleetPostCopyExecutingSourceGone: the source of a post-copy
// migration stops while the target's lazy restore still lacks chunks:
// here its lazy-pages is stopped once it holds the unit's userfaultfds,
// and its background fetch fails (failpoint postcopy.fill), so nothing
// is fetched but the eager chunks before the restore. The source stops;
// lazy-pages goes on, and the page server's fetch of the first chunk it
// needs fails. The unit never runs on a page that did not come (no line
// with a wrong checksum): the run goes back to parked at the snapshot it
// migrated with, the interval journaled pages-lost, still owing its
// slabs, and its record verifies. With the source back, the target
// (started again, the failpoint off) fetches the slabs and resumes the
// oracle as the same process.
func TestFleetPostCopyExecutingSourceGone(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	const id = "postcopy-gone"
	a, b, keyB := postCopyRunning(t, id, "2s", "postcopy.fill")
	found := make(chan int, 1)
	go stopLazyPages(b, id, 2, found)
	onA, atPark := migrateExecuting(t, a, id, keyB)
	pid := <-found
	if pid == 0 {
		t.Fatal("no lazy-pages with two userfaultfds on the target")
	}
	mustStop(t, a)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	s := waitParked(t, b, id)
	n := len(s.Segments)
	if got := kinds(s.Segments[n-3:]); got != "resumed executed suspended" || s.Segments[n-1].Snapshot != s.Segments[n-4].Snapshot {
		t.Fatalf("segments %s; want the target's interval lost, parked back at the migration's snapshot", kinds(s.Segments))
	}
	if rs := s.Segments[n-2].Restore; rs == nil || !rs.Lazy || rs.ResidentNS != 0 || !strings.Contains(rs.PagesLost, "not fetched") {
		t.Fatalf("the lost interval's restore %+v", rs)
	}
	ls := output(t, b.stdout(id))
	for i, l := range ls {
		if l.Checksum != atPark.Checksum || l.Verify != atPark.Checksum || l.StartTime != atPark.StartTime {
			t.Fatalf("line %d on the target %+v; last on the source %+v", i, l, atPark)
		}
	}
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK || v.Owed == 0 {
		t.Fatalf("verify on the target: %+v, %v; want ok, owing slabs", v, err)
	}

	mustStart(t, a)
	mustStop(t, b)
	b.env = nil
	mustStart(t, b)
	waitLog(t, b, "post-copy: every slab of the run is here")
	before := len(ls)
	if _, err := b.c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	ls = waitLines(t, b.stdout(id), "a line verified after the resume", func(ls []line) bool {
		return len(ls) > before && last(ls).VerifiedAt > atPark.Counter
	})
	if after := ls[before]; after.Counter != atPark.Counter+1 || after.StartTime != atPark.StartTime || after.Pid != atPark.Pid || after.Checksum != atPark.Checksum {
		t.Fatalf("first line after the resume %+v; last on the source %+v", after, atPark)
	}
	checkOneProcess(t, append(onA, ls[before:]...))
	for _, d := range []*daemon{a, b} {
		if v, err := d.c.Verify(ctx, id); err != nil || !v.OK {
			t.Fatalf("verify on the %s daemon: %+v, %v", d.name, v, err)
		}
	}
}

// TestFleetPostCopyParkWhileOwing: a run resumed post-copy is parked on
// its target before its slabs are adopted (the background fetch fails:
// failpoint postcopy.fill; the lazy restore fetched every chunk it
// served). The park finds none of its chunks held by the owed snapshot,
// its base: that slab is not in the store (internal/park, "not held after
// all"), so it stores every chunk itself, and succeeds; the oracle
// resumes from it as the same process, and the record verifies.
func TestFleetPostCopyParkWhileOwing(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	const id = "postcopy-park"
	a, b, keyB := postCopyRunning(t, id, "2s", "postcopy.fill")
	onA, _ := migrateExecuting(t, a, id, keyB)
	waitResident(t, b, id)
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK || v.Owed == 0 {
		t.Fatalf("verify on the target: %+v, %v; want ok, still owing", v, err)
	}
	_, atPark := park(t, b, id)
	resume(t, b, id, onA, atPark)
	if v, err := b.c.Verify(ctx, id); err != nil || !v.OK {
		t.Fatalf("verify on the target: %+v, %v", v, err)
	}
}
