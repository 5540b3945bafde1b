//go:build linux

package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// TestFleetMigrateEgress: TestEgressElsewhere's move, made by the fleet.
// Two hosts of a fleet, each with egress, their pools, links and tables
// apart, and a third granting none; on the first, two units each read a
// stream from the world. A migration of one to the third is refused
// (grant_refused) before anything changes: it goes on running, its
// stream flowing. One is migrated to the second host (`migrate`), then
// the first host is drained, which moves the other there, never to the
// third. Each moved unit, resumed on the second
// host, sees the connection it had end at once with an abort (not a
// hang), opens a new one to the world, and its resumed interval's
// journal lists the connection closed (reason: none kept here); its
// record verifies there, the directory names the second host its owner,
// and the world saw no connection but the one each unit opened first.
// The first host keeps nothing of a run it handed over — its link,
// chains and slot go with the hand-over — and the rest as it was: after
// the migration, the other unit's link, chains and slot, its stream
// still flowing. Neither host leaves a link, chain or slot once the runs
// close.
func TestFleetMigrateEgress(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	w := newEgressWorld(t)
	t.Cleanup(func() { removeEgressHost(t); removeEgressHostB() })
	a, _ := f.start(t, "fleet-egress-a", append(f.flags(), "--lease-ttl", "10s", "--egress-allow", "203.0.113.0/24"))
	b, keyB := f.start(t, "fleet-egress-b", append(f.flags(), "--lease-ttl", "10s", "--egress-allow", "203.0.113.0/24",
		"--egress-pool", egressPoolB, "--egress-link-prefix", egressPrefixB))
	// The third host grants no egress: its ceiling refuses the units'.
	cc, keyC := f.start(t, "fleet-egress-c", append(f.flags(), "--lease-ttl", "10s"))
	kB, err := record.ParseAddress(keyB)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*daemon{a, b, cc} {
		mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	}
	grants := egressGrants(t, egressWorld+"/32:8080-8081")
	env := []string{"HOSTILE_ADDR=" + egressWorld + ":8081", "HOSTILE_THEN=" + egressWorld + ":8080"}

	const stayer = "egress-stayer"
	startHostile(t, a, stayer, "egress-stream", env, grants)
	closeAtEnd(t, b, stayer)
	waitSaid(t, a, stayer, "egress-stream", "got 2")
	others := egressLeft(t, a) // the stayer's link, chains and slot
	if len(others) == 0 {
		t.Fatalf("the first host holds no link of %s", stayer)
	}

	// flowing checks that the stayer's stream goes on, on the first host.
	flowing := func(t *testing.T) {
		t.Helper()
		n := len(said(a, stayer, "egress-stream"))
		deadline := time.Now().Add(10 * time.Second)
		for len(said(a, stayer, "egress-stream")) < n+3 {
			if time.Now().After(deadline) {
				t.Fatalf("%s's stream stopped on the first host: %q", stayer, said(a, stayer, "egress-stream"))
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, l := range said(a, stayer, "egress-stream") {
			if !strings.HasPrefix(l, "got ") {
				t.Fatalf("%s on the first host said %q", stayer, l)
			}
		}
	}

	// moved checks run id, moved to b by a call that returned at
	// returned.
	moved := func(t *testing.T, id string, returned time.Time) {
		t.Helper()
		r, err := b.run(ctx, id)
		if err != nil || r.Phase != "executing" || r.Status != "running" || r.HandedOff {
			t.Fatalf("on the second host: %+v, %v", r, err)
		}
		if ra, err := a.run(ctx, id); err != nil || !ra.HandedOff {
			t.Fatalf("on the first host: %+v, %v; want handed off", ra, err)
		}
		line, took := endedAfter(t, b, id, returned)
		if !strings.Contains(line, "connection abort") || took > 5*time.Second {
			t.Fatalf("the old connection on the second host: %q %s after the move returned, want an abort at once", line, took)
		}
		then := waitSaid(t, b, id, "egress-stream", "then ")
		if !strings.Contains(then, "ok HTTP/1.0 200 OK from the world") {
			t.Fatalf("a new connection on the second host: %q", then)
		}
		if _, err := b.c.Park(ctx, id); err != nil {
			t.Fatalf("park on the second host: %v", err)
		}
		cs := lastClosed(t, b, id)
		if len(cs) != 1 || cs[0].Reason != attest.ClosedElsewhere || cs[0].Total != 1 || len(cs[0].Conns) != 1 ||
			cs[0].Conns[0].Remote != netip.MustParseAddrPort(egressWorld+":8081") {
			t.Fatalf("the resumed interval's closed entries: %+v", cs)
		}
		if v, err := b.c.Verify(ctx, id); err != nil || !v.OK {
			t.Fatalf("verify on the second host: %+v, %v", v, err)
		}
		pr, err := b.run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if e, err := f.dir(t).Run(ctx, genesisOf(t, pr)); err != nil || e.Owner != kB || e.Head.String() != pr.Head {
			t.Fatalf("directory %+v, %v; want owned by the second host at %s", e, err, pr.Head)
		}
		t.Logf("on the second host: %q %s after the move returned; %s; closed %+v", line, took, then, cs[0])
	}

	// To a host whose ceiling refuses the unit's grant: refused
	// (grant_refused) before anything changes, as a target that would not
	// take a run is (docs/fleet.md, "Migration", step 0).
	t.Run("BeyondTheCeiling", func(t *testing.T) {
		was, err := a.run(ctx, stayer)
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.c.Migrate(ctx, stayer, keyC)
		ae := apiError(t, err, api.CodeGrantRefused)
		t.Logf("migrate to the host without egress: %s", ae.Message)
		if r, err := a.run(ctx, stayer); err != nil || r.HandedOff || r.Status != "running" || r.Segments != was.Segments || r.Head != was.Head {
			t.Fatalf("after the refusal the first host holds %+v, %v; want %+v", r, err, was)
		}
		if _, err := cc.run(ctx, stayer); err == nil {
			t.Fatal("the host without egress stored the run")
		}
		if left := egressLeft(t, a); !slices.Equal(left, others) {
			t.Fatalf("the first host after the refusal holds %v; want %v", left, others)
		}
		flowing(t)
	})

	t.Run("Migrated", func(t *testing.T) {
		const id = "egress-mover"
		startHostile(t, a, id, "egress-stream", env, grants)
		closeAtEnd(t, b, id)
		waitSaid(t, a, id, "egress-stream", "got 5")
		if _, err := a.c.Migrate(ctx, id, keyB); err != nil {
			t.Fatalf("migrate: %v\n%s", err, a.logTail())
		}
		returned := time.Now()
		moved(t, id, returned)
		if left := egressLeft(t, a); !slices.Equal(left, others) {
			t.Fatalf("the first host after the migration holds %v; want only the other run's %v", left, others)
		}
		flowing(t)
	})

	t.Run("Drained", func(t *testing.T) {
		dr, err := a.c.Drain(ctx, api.DrainRequest{})
		if err != nil || dr.Moved != 1 || dr.Left != 0 {
			t.Fatalf("drain: %+v, %v\n%s", dr, err, a.logTail())
		}
		returned := time.Now()
		moved(t, stayer, returned)
		if left := egressLeft(t, a); len(left) > 0 {
			t.Fatalf("the drained host holds %v", left)
		}
		if _, err := cc.run(ctx, stayer); err == nil {
			t.Fatal("the drain sent the run to the host without egress")
		}
	})

	if n := w.streams.Load(); n != 2 {
		t.Fatalf("the world saw %d stream connections, want the two the units opened first", n)
	}
	for _, d := range []*daemon{a, b, cc} {
		if err := d.closeAll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if left := egressLeft(t, a); len(left) > 0 {
		t.Fatalf("the first host left: %v", left)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, egressPrefixB) {
			t.Fatalf("the second host left link %s", l.Attrs().Name)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(b.state, "egress")); len(ents) > 0 {
		t.Fatalf("the second host left %d slot files", len(ents))
	}
}
