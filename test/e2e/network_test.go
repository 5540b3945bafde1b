//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// tcpLine is the oracle's TCP report (units/oracle, TCP_PORT set).
type tcpLine struct {
	Counter      uint64 `json:"counter"`
	LoUp         bool   `json:"lo_up"`
	TCPHeld      uint64 `json:"tcp_held"`
	TCPHeldPort  int    `json:"tcp_held_port"`
	TCPFreshOK   uint64 `json:"tcp_fresh_ok"`
	TCPFreshFail uint64 `json:"tcp_fresh_fail"`
	TCPMPTCP     bool   `json:"tcp_mptcp"`
}

// tcpOutput reads the TCP fields of the oracle's lines.
func tcpOutput(t *testing.T, path string) []tcpLine {
	t.Helper()
	output(t, path) // fails the test on a broken invariant
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []tcpLine
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var tl tcpLine
		if err := json.Unmarshal([]byte(l), &tl); err != nil {
			t.Fatal(err)
		}
		out = append(out, tl)
	}
	return out
}

// startTCPOracle starts the oracle with its TCP state (a loopback server,
// a connection held to it, a fresh one per tick) in a sandbox granted
// loopback.
func startTCPOracle(t *testing.T, d *daemon, id string) {
	t.Helper()
	r, err := d.c.Start(context.Background(), api.RunRequest{ID: id,
		Unit:   unit.Spec{Image: oracleImage, Env: append([]string{"TCP_PORT=7777"}, oracleEnv...)},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.Loopback}})
	if err != nil {
		t.Fatalf("start %s on the %s daemon: %v", id, d.name, err)
	}
	closeAtEnd(t, d, id)
	if r.Status != "running" {
		t.Fatalf("started %+v", r)
	}
	waitLines(t, d.stdout(id), "the oracle's first verified line", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > 0
	})
}

// checkTCP checks the oracle's TCP state over lines (every incarnation's,
// in order) and that from the line with counter from on, ten more ticks
// each made their round trip on the held connection and a fresh
// connection that succeeded.
func checkTCP(t *testing.T, ls []tcpLine, from uint64) {
	t.Helper()
	first := ls[0]
	if first.TCPHeldPort == 0 || first.TCPMPTCP || !first.LoUp {
		t.Fatalf("first line %+v: want a plain TCP connection held open, loopback up", first)
	}
	var base *tcpLine
	for i := range ls {
		l := ls[i]
		// Every tick: one round trip on the held connection, one fresh
		// connection that succeeded or failed.
		if l.TCPHeld != l.Counter || l.TCPHeldPort != first.TCPHeldPort || l.TCPMPTCP || !l.LoUp ||
			l.TCPFreshOK+l.TCPFreshFail != l.Counter {
			t.Fatalf("line %+v; first %+v", l, first)
		}
		if l.Counter == from {
			base = &ls[i]
		}
	}
	end := ls[len(ls)-1]
	if base == nil || end.Counter < from+10 {
		t.Fatalf("no ten lines from counter %d: last %+v", from, end)
	}
	if end.TCPFreshFail != base.TCPFreshFail {
		t.Fatalf("fresh connections failed after counter %d: %+v then %+v", from, *base, end)
	}
	t.Logf("TCP: held connection on port %d carried %d round trips; %d fresh connections, %d failed (the ones in flight at a park)",
		end.TCPHeldPort, end.TCPHeld, end.TCPFreshOK+end.TCPFreshFail, end.TCPFreshFail)
}

// TestTCPStateSurvivesPark parks a unit with TCP state — a server on
// loopback, a connection to it held open, fresh connections every tick —
// and resumes it on the same host, then on a second host from a bundle:
// each time the held connection goes on (TCP repair) and the server
// accepts new connections, in a sandbox whose loopback is up and whose
// sockets are plain TCP (MPTCP off).
func TestTCPStateSurvivesPark(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := shared(t)
	const id = "tcp"
	startTCPOracle(t, a, id)

	_, atPark := park(t, a, id)
	resume(t, a, id, nil, atPark)
	waitLines(t, a.stdout(id), "ten ticks after the resume", func(ls []line) bool {
		return last(ls).Counter >= atPark.Counter+12
	})
	checkTCP(t, tcpOutput(t, a.stdout(id)), atPark.Counter+2)

	// To a second host, from a bundle.
	_, atPark = park(t, a, id)
	onA := output(t, a.stdout(id))
	tcpA := tcpOutput(t, a.stdout(id))
	bundle := filepath.Join(t.TempDir(), "tcp.bundle")
	f, err := os.Create(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.c.Export(ctx, id, f); err != nil {
		t.Fatalf("export: %v", err)
	}
	f.Close()
	b := mustDaemon(t, "tcp-second")
	mustImportImage(t, b, oracleArchive, oracleImage, oracleDigest)
	trustHost(t, a, b)
	f, err = os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.c.Import(ctx, f, "")
	f.Close()
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	resume(t, b, id, onA, atPark)
	waitLines(t, b.stdout(id), "ten ticks after the resume on the second host", func(ls []line) bool {
		return last(ls).Counter >= atPark.Counter+12
	})
	checkTCP(t, append(tcpA, tcpOutput(t, b.stdout(id))...), atPark.Counter+2)
}

// TestEgressRefused: a host without an egress ceiling (serve
// --egress-allow) refuses a run that asks for egress (grant_refused)
// before anything is made: no run is stored, no sandbox is left.
func TestEgressRefused(t *testing.T) {
	privileged(t)
	d := shared(t)
	ctx := context.Background()
	const id = "egress-refused"
	_, err := d.c.Start(ctx, api.RunRequest{ID: id,
		Unit: unit.Spec{Image: oracleImage, Env: oracleEnv},
		Grants: unit.Grants{MemoryBytes: 64 << 20, Network: unit.Egress,
			Egress: []unit.Dest{{CIDR: "192.0.2.0/24", Proto: "tcp", Ports: "80"}}}})
	apiError(t, err, api.CodeGrantRefused)
	_, err = d.c.Show(ctx, id)
	apiError(t, err, api.CodeNotFound)
}
