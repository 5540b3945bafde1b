//go:build linux

package e2e

import (
	"bytes"
	"context"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/runrecordd/runrecordd/internal/failpoint"
	"github.com/runrecordd/runrecordd/pkg/attest"
)

// The second egress daemon's links and tables, apart from the first's
// (serve --egress-pool, --egress-link-prefix).
const (
	egressPoolB   = "10.253.0.0/16"
	egressPrefixB = "rrdx"
)

// removeEgressHostB removes what the second daemon sets up for every
// run: its tables and its pool's blackhole route.
func removeEgressHostB() {
	for _, fam := range []string{"ip", "netdev"} {
		_ = exec.Command("nft", "delete", "table", fam, "runrecordd_egress_"+egressPrefixB).Run()
	}
	_ = exec.Command("ip", "route", "del", "blackhole", egressPoolB).Run()
}

// lastClosed is the closed entries of run id's last Executed segment's
// journal.
func lastClosed(t *testing.T, d *daemon, id string) []attest.Closed {
	t.Helper()
	s, err := d.c.Show(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var j *attest.Journal
	for _, seg := range s.Segments {
		if seg.Kind == "executed" {
			_, j = d.journal(t, seg)
		}
	}
	if j == nil {
		t.Fatalf("run %s has no Executed segment", id)
	}
	var out []attest.Closed
	for _, e := range j.Entries {
		if e.Kind == attest.ClosedKind {
			c, err := attest.DecodeClosed(e.Data)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
	}
	return out
}

// endedAfter waits for run id's egress-stream to say its connection
// ended, and returns the line and how long after since it came.
func endedAfter(t *testing.T, d *daemon, id string, since time.Time) (string, time.Duration) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, l := range said(d, id, "egress-stream") {
			if strings.HasPrefix(l, "ended ") {
				return l, time.Since(since)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream did not end 30 s after the resume: %q\n%s", said(d, id, "egress-stream"), d.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEgressElsewhere: two daemons on this host, each with egress, their
// pools, links and tables apart. A unit reading a stream from the world
// is parked on the first, exported, imported on the second and resumed
// there: the connection it had ends at once with an abort (not a hang),
// a new connection to the world works, the interval's journal lists the
// connection closed (reason: none kept here), and the record verifies.
// A unit parked on the second past its park hold (2 s) resumes with its
// connection closed the same way (reason: the hold expired). A resume
// on the second killed after its append, before its pass, has its
// connection closed by the restarted daemon, as its entry says. Neither
// daemon's links, chains or slots are left once the runs close.
func TestEgressElsewhere(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	w := newEgressWorld(t)
	t.Cleanup(func() { removeEgressHost(t); removeEgressHostB() })
	streams := w.streams.Load()
	a := mustDaemon(t, "egress-a", func(d *daemon) {
		d.flags = []string{"--egress-allow", "203.0.113.0/24"}
	})
	b := mustDaemon(t, "egress-b", func(d *daemon) {
		d.flags = []string{"--egress-allow", "203.0.113.0/24", "--egress-pool", egressPoolB,
			"--egress-link-prefix", egressPrefixB, "--egress-park-hold", "2s"}
	})
	for _, d := range []*daemon{a, b} {
		mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	}
	trustHost(t, a, b)
	grants := egressGrants(t, egressWorld+"/32:8080-8081")
	env := []string{"HOSTILE_ADDR=" + egressWorld + ":8081", "HOSTILE_THEN=" + egressWorld + ":8080"}

	t.Run("Migrated", func(t *testing.T) {
		const id = "egress-mover"
		startHostile(t, a, id, "egress-stream", env, grants)
		waitSaid(t, a, id, "egress-stream", "got 5")
		if _, err := a.c.Park(ctx, id); err != nil {
			t.Fatalf("park: %v", err)
		}
		var buf bytes.Buffer
		if err := a.c.Export(ctx, id, &buf); err != nil {
			t.Fatalf("export: %v", err)
		}
		if _, err := b.c.Import(ctx, bytes.NewReader(buf.Bytes()), ""); err != nil {
			t.Fatalf("import: %v", err)
		}
		t0 := time.Now()
		if _, err := b.c.Resume(ctx, id); err != nil {
			t.Fatalf("resume on the second daemon: %v\n%s", err, b.logTail())
		}
		line, took := endedAfter(t, b, id, t0)
		if !strings.Contains(line, "connection abort") || took > 5*time.Second {
			t.Fatalf("the old connection on the second daemon: %q %s after the resume, want an abort at once", line, took)
		}
		then := waitSaid(t, b, id, "egress-stream", "then ")
		if !strings.Contains(then, "ok HTTP/1.0 200 OK from the world") {
			t.Fatalf("a new connection on the second daemon: %q", then)
		}
		if _, err := b.c.Park(ctx, id); err != nil {
			t.Fatalf("park on the second daemon: %v", err)
		}
		cs := lastClosed(t, b, id)
		if len(cs) != 1 || cs[0].Reason != attest.ClosedElsewhere || cs[0].Total != 1 || len(cs[0].Conns) != 1 ||
			cs[0].Conns[0].Remote != netip.MustParseAddrPort(egressWorld+":8081") {
			t.Fatalf("the resumed interval's closed entries: %+v", cs)
		}
		if v, err := b.c.Verify(ctx, id); err != nil || !v.OK {
			t.Fatalf("verify on the second daemon: %+v, %v", v, err)
		}
		if n := w.streams.Load() - streams; n != 1 {
			t.Fatalf("the world saw %d stream connections, want the one", n)
		}
		t.Logf("resumed on the second daemon: %q %s after the resume; %s; closed %+v", line, took, then, cs[0])
	})

	t.Run("PastTheHold", func(t *testing.T) {
		const id = "egress-held"
		startHostile(t, b, id, "egress-stream", env, grants)
		waitSaid(t, b, id, "egress-stream", "got 5")
		if _, err := b.c.Park(ctx, id); err != nil {
			t.Fatalf("park: %v", err)
		}
		time.Sleep(4 * time.Second) // the hold is 2 s
		t0 := time.Now()
		if _, err := b.c.Resume(ctx, id); err != nil {
			t.Fatalf("resume: %v", err)
		}
		line, took := endedAfter(t, b, id, t0)
		if !strings.Contains(line, "connection abort") || took > 5*time.Second {
			t.Fatalf("the connection after the hold: %q %s after the resume, want an abort at once", line, took)
		}
		if then := waitSaid(t, b, id, "egress-stream", "then "); !strings.Contains(then, "ok HTTP/1.0 200 OK") {
			t.Fatalf("a new connection after the hold: %q", then)
		}
		if _, err := b.c.Park(ctx, id); err != nil {
			t.Fatalf("park again: %v", err)
		}
		cs := lastClosed(t, b, id)
		if len(cs) != 1 || cs[0].Reason != attest.ClosedExpired || cs[0].Total != 1 {
			t.Fatalf("the resumed interval's closed entries: %+v", cs)
		}
	})

	// The second daemon is killed after the resume's append, its closed
	// entry journaled and nothing closed: its restart passes the held
	// link, closing the connection the entry lists.
	t.Run("CrashBeforePass", func(t *testing.T) {
		const id = "egress-crash-mover"
		startHostile(t, a, id, "egress-stream", env, grants)
		waitSaid(t, a, id, "egress-stream", "got 5")
		if _, err := a.c.Park(ctx, id); err != nil {
			t.Fatalf("park: %v", err)
		}
		var buf bytes.Buffer
		if err := a.c.Export(ctx, id, &buf); err != nil {
			t.Fatalf("export: %v", err)
		}
		if _, err := b.c.Import(ctx, bytes.NewReader(buf.Bytes()), ""); err != nil {
			t.Fatalf("import: %v", err)
		}
		mustStop(t, b)
		// Eager: a lazy restore that no daemon saw finish is parked
		// back at the restart (TestLazyFaults), and lazy-pages may
		// still be serving when the resume reaches its append.
		flags := b.flags
		b.flags = append(slices.Clip(flags), "--lazy-resume=false")
		defer func() { b.flags = flags }()
		b.env = []string{failpoint.Env + "=resume.appended"}
		err := b.start()
		b.env = nil
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.c.Resume(ctx, id); err == nil {
			t.Fatal("the resume armed to crash answered")
		}
		crashKilled(t, b, "resume.appended")
		// Held: the stream neither goes on nor ends.
		time.Sleep(time.Second)
		for _, l := range said(b, id, "egress-stream") {
			if strings.HasPrefix(l, "ended ") {
				t.Fatalf("the connection ended before the restart: %q", l)
			}
		}
		t0 := time.Now()
		mustStart(t, b)
		line, took := endedAfter(t, b, id, t0)
		if !strings.Contains(line, "connection abort") {
			t.Fatalf("the old connection after the restart: %q", line)
		}
		if then := waitSaid(t, b, id, "egress-stream", "then "); !strings.Contains(then, "ok HTTP/1.0 200 OK from the world") {
			t.Fatalf("a new connection after the restart: %q", then)
		}
		if _, err := b.c.Park(ctx, id); err != nil {
			t.Fatalf("park after the restart: %v", err)
		}
		cs := lastClosed(t, b, id)
		if len(cs) != 1 || cs[0].Reason != attest.ClosedElsewhere || cs[0].Total != 1 ||
			cs[0].Conns[0].Remote != netip.MustParseAddrPort(egressWorld+":8081") {
			t.Fatalf("the resumed interval's closed entries: %+v", cs)
		}
		if v, err := b.c.Verify(ctx, id); err != nil || !v.OK {
			t.Fatalf("verify: %+v, %v", v, err)
		}
		t.Logf("after the restart: %q %s after the start; closed %+v", line, took, cs[0])
	})

	for _, d := range []*daemon{a, b} {
		if err := d.closeAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if left := egressLeft(t, a); len(left) > 0 {
		t.Fatalf("the first daemon left: %v", left)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, egressPrefixB) {
			t.Fatalf("the second daemon left link %s", l.Attrs().Name)
		}
	}
}
