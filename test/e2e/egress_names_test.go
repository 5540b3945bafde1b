//go:build linux

package e2e

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/runrecordd/runrecordd/pkg/attest"
)

// The world's resolver: UDP port 53 of egressWorld, the daemon's
// upstream (serve --egress-resolver). It answers every A query for a name
// under egressZone with egressWorld (TTL 60 s), any other name with
// NXDOMAIN, and keeps the names it was asked.
const egressZone = ".rrtest.example"

type worldDNS struct {
	mu    sync.Mutex
	asked []string
}

func (w *worldDNS) names() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.asked)
}

// serveWorldDNS starts the world's resolver until the test ends.
func serveWorldDNS(t *testing.T, w *egressWorldNS) *worldDNS {
	t.Helper()
	var pc net.PacketConn
	inNetns(t, w.ns, func() {
		var err error
		if pc, err = net.ListenPacket("udp4", egressWorld+":53"); err != nil {
			t.Error(err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() { pc.Close() })
	dns := &worldDNS{}
	go func() {
		b := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			if reply := dns.answer(b[:n]); reply != nil {
				_, _ = pc.WriteTo(reply, from)
			}
		}
	}()
	return dns
}

// answer is the world resolver's reply to query, nil for none.
func (w *worldDNS) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.TrimSuffix(q.Name.String(), ".")
	w.mu.Lock()
	w.asked = append(w.asked, name)
	w.mu.Unlock()
	rcode := dnsmessage.RCodeSuccess
	if !strings.HasSuffix(name, egressZone) {
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil
	}
	if rcode == dnsmessage.RCodeSuccess && q.Type == dnsmessage.TypeA {
		a := netip.MustParseAddr(egressWorld).As4()
		if b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a}) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// testEgressNames: a unit granted a name resolves it through its
// /etc/resolv.conf (the daemon's resolver, which asks the world's) and
// fetches from it, on the grant's port only; the world's address is
// refused before the unit resolved the name, and so is a name the grant
// does not list (the daemon never asks upstream for it). The interval's
// journal holds the one answer (asked again, the same answer needs no
// second entry), and the record verifies. A restarted daemon answers a
// running unit too, and goes on with its interval's entries.
func testEgressNames(t *testing.T, d *daemon, w *egressWorldNS) {
	ctx := context.Background()
	dns := serveWorldDNS(t, w)
	const id = "egress-names"
	world, other := "world"+egressZone, "other"+egressZone
	got := dialResults(t, d, id, egressGrants(t, world+":8080"),
		egressWorld+":8080", other+":8080", world+":8080", world+":8082", world+":8080")
	t.Logf("egress-names said %q", said(d, id, "egress-dial"))
	if !strings.HasPrefix(got[egressWorld+":8080"], "refused") {
		t.Errorf("the world's address before the name was resolved: %q, want refused", got[egressWorld+":8080"])
	}
	if !strings.HasPrefix(got[other+":8080"], "refused") || !strings.Contains(got[other+":8080"], "lookup "+other) {
		t.Errorf("a name the grant does not list: %q, want refused at its lookup", got[other+":8080"])
	}
	if !strings.HasPrefix(got[world+":8080"], "ok HTTP/1.0 200 OK from the world") {
		t.Errorf("the granted name: %q", got[world+":8080"])
	}
	if !strings.HasPrefix(got[world+":8082"], "refused") || strings.Contains(got[world+":8082"], "lookup") {
		t.Errorf("the granted name on a port the grant does not give: %q, want refused at the connect", got[world+":8082"])
	}
	asked := dns.names()
	if slices.Contains(asked, other) || !slices.Contains(asked, world) {
		t.Errorf("the world's resolver was asked %q: want %s, never %s", asked, world, other)
	}
	if _, err := d.c.Park(ctx, id); err != nil {
		t.Fatalf("park: %v", err)
	}
	rs := journaledResolutions(t, d, id)
	want := attest.Resolution{Name: world, TTLSec: 60, Addrs: []netip.Addr{netip.MustParseAddr(egressWorld)}}
	if len(rs) != 1 || rs[0].Name != want.Name || rs[0].TTLSec != want.TTLSec || !slices.Equal(rs[0].Addrs, want.Addrs) {
		t.Fatalf("the interval journaled %+v, want the one %+v", rs, want)
	}
	if v, err := d.c.Verify(ctx, id); err != nil || !v.OK {
		t.Fatalf("verify: %+v, %v", v, err)
	}
	if _, err := d.c.Close(ctx, id, "e2e: names done"); err != nil {
		t.Fatalf("close: %v", err)
	}

	// A daemon restarted with the unit running answers it too (it adopts
	// the run's slot with its grant from the store), and goes on with the
	// interval's entries: the same answer adds none.
	const loop = "egress-names-loop"
	startHostile(t, d, loop, "egress-dial-loop", []string{"HOSTILE_ADDR=" + world + ":8080"}, egressGrants(t, world+":8080"))
	waitSaid(t, d, loop, "egress-dial-loop", "ok ")
	mustStop(t, d)
	mustStart(t, d)
	n := len(said(d, loop, "egress-dial-loop"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		ls := said(d, loop, "egress-dial-loop")
		if len(ls) > n+2 && strings.HasPrefix(ls[len(ls)-1], "ok ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the unit said %q (%d lines before it)", ls[min(n, len(ls)):], n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := d.c.Park(ctx, loop); err != nil {
		t.Fatalf("park after the restart: %v", err)
	}
	if rs := journaledResolutions(t, d, loop); len(rs) != 1 || rs[0].Name != world {
		t.Fatalf("the interval across the restart journaled %+v, want the one answer", rs)
	}
	if _, err := d.c.Close(ctx, loop, "e2e: names done"); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// journaledResolutions are the resolution entries of run id's Executed
// segments' journals.
func journaledResolutions(t *testing.T, d *daemon, id string) []attest.Resolution {
	t.Helper()
	s, err := d.c.Show(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var rs []attest.Resolution
	for _, seg := range s.Segments {
		if seg.Kind != "executed" {
			continue
		}
		_, j := d.journal(t, seg)
		for _, e := range j.Entries {
			if e.Kind == attest.ResolutionKind {
				r, err := attest.DecodeResolution(e.Data)
				if err != nil {
					t.Fatal(err)
				}
				rs = append(rs, r)
			}
		}
	}
	return rs
}
