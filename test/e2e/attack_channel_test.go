//go:build linux

package e2e

// Attacks on the transcript channel (docs/trust.md, "What a unit can reach:
// the channel"; docs/limits.md, "The channel and the transcript"), each by
// the hostile unit in transcript mode:
//
//   - TestAttackTranscriptSymlink: the unit replaces its transcript with a
//     symlink to a host file, appends and awaits. The host file is
//     untouched, the park seals what the unit appended, and nothing else.
//   - TestAttackTranscriptFIFO: a FIFO in place of the transcript, at a park
//     and across a daemon restart (its recovery of the transcript): the
//     park completes, the restarted daemon serves and recovers the run; a
//     FIFO, a symlink to a host file and one to /dev/zero planted in
//     channel directories while the daemon is down are refused at its
//     start, their runs left lost, the host file untouched.
//   - TestAttackChannelFlood: 64 connections, each holding an unterminated
//     line of 1 MiB: the channel keeps its 16, refuses the rest with
//     too_many_connections, and the daemon's memory stays bounded.
//   - TestAttackChannelLimits: a grant set's transcript, call and payload
//     limits, each refused with its code, the record holding what was
//     accepted and nothing else.
//   - TestAttackChannelPayload: 96 MiB appended in one interval does not
//     stay in the daemon's memory (the journal is spooled to disk), and the
//     park seals all of it.
//   - TestAttackLongCallID: a call id of 250 bytes (its result file's name
//     was longer than NAME_MAX) gets its result and the run resumes.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// chHostileReady: the shared daemon has the hostile unit's image.
var chHostileReady bool

// chShared is the shared daemon with the hostile unit's image.
func chShared(t *testing.T) *daemon {
	t.Helper()
	d := shared(t)
	if !chHostileReady {
		mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
		chHostileReady = true
	}
	return d
}

// chOwnDaemon starts a daemon for t alone, with the hostile unit's image.
// Its cleanup first waits for the daemon's start-up probe to end: a daemon
// stopped while its probe runs can take longer than the suite's stop
// timeout, which is not what these tests are about.
func chOwnDaemon(t *testing.T, name string) *daemon {
	t.Helper()
	d := mustDaemon(t, name)
	t.Cleanup(func() {
		for deadline := time.Now().Add(2 * time.Minute); d.running() && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if h, err := d.c.Host(context.Background()); err != nil || h.ImageParks.Status != "probing" {
				return
			}
		}
	})
	mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	return d
}

// chStart starts attack as a transcript-mode run of the hostile unit.
func chStart(t *testing.T, d *daemon, id, attack string, limits unit.Limits, env ...string) {
	t.Helper()
	r, err := d.c.Start(context.Background(), api.RunRequest{ID: id,
		Unit:   unit.Spec{Image: hostileImage, Env: append([]string{"HOSTILE=" + attack}, env...), Mode: unit.TranscriptMode},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 128 << 20, Network: unit.NoNetwork, Limits: limits}})
	if err != nil {
		t.Fatalf("start %s (%s) on the %s daemon: %v", id, attack, d.name, err)
	}
	closeAtEnd(t, d, id)
	if r.Phase != "executing" || r.Mode != "transcript" {
		t.Fatalf("started %+v", r)
	}
}

// chSaid waits until the unit of run id has printed a line starting with
// "hostile: ATTACK: "+prefix, and returns the rest of it.
func chSaid(t *testing.T, d *daemon, id, prefix string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(d.stdout(id))
		for _, l := range strings.Split(string(b), "\n") {
			_, rest, ok := strings.Cut(l, ": ")
			if !ok {
				continue
			}
			if _, rest, ok = strings.Cut(rest, ": "); ok && strings.HasPrefix(rest, prefix) {
				return strings.TrimPrefix(rest, prefix)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: the unit never said %q; its stdout:\n%s\ndaemon log:\n%s", id, prefix, b, d.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// chServing checks that the daemon still answers.
func chServing(t *testing.T, d *daemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := d.c.List(ctx, ""); err != nil {
		t.Fatalf("the %s daemon does not serve: %v", d.name, err)
	}
}

// chVerified checks that run id verifies from genesis.
func chVerified(t *testing.T, d *daemon, id string) {
	t.Helper()
	if err := verifyRun(context.Background(), d, id); err != nil {
		t.Fatal(err)
	}
}

func TestAttackTranscriptSymlink(t *testing.T) {
	privileged(t)
	d := chShared(t)
	const id = "atk-symlink"
	victim := filepath.Join(d.root, "victim")
	const secret = "host secret: not the unit's\n"
	if err := os.WriteFile(victim, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	chStart(t, d, id, "transcript-symlink", unit.Limits{}, "TARGET="+victim)
	replace := chSaid(t, d, id, "replace: ")
	r := trParked(t, d, id, 2)

	if b, err := os.ReadFile(victim); err != nil || string(b) != secret {
		t.Errorf("the host file %s is now %q (%v), was %q", victim, b, err, secret)
	}
	if fi, err := os.Lstat(victim); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("the host file %s: %v %v", victim, fi, err)
	}
	if !strings.HasPrefix(replace, "refused") {
		t.Errorf("the unit replaced its transcript: %q", replace)
	}
	s := mustShow(t, d, id)
	if got := trSealed(t, d, s.Segments[1]); got != "hostile line\n" {
		t.Errorf("the park sealed %q as the transcript, want what the unit appended", got)
	}
	trCheckTranscript(t, d, s, "hostile line\n")
	chVerified(t, d, id)
	chServing(t, d)
	unchanged(t, d, id, r)
}

func TestAttackTranscriptFIFO(t *testing.T) {
	privileged(t)
	t.Run("Restart", func(t *testing.T) {
		d := chOwnDaemon(t, "fifo")
		const id = "atk-fifo-restart"
		chStart(t, d, id, "transcript-fifo", unit.Limits{})
		chSaid(t, d, id, "idling")
		// What a unit could leave in its channel directory when it was
		// writable, planted by hand while the daemon is down: a FIFO, a
		// symlink to a host file, one to /dev/zero. The restarted daemon
		// refuses each transcript, leaves its run lost and serves.
		victim := filepath.Join(d.root, "victim")
		const secret = "host secret: not the unit's\n"
		if err := os.WriteFile(victim, []byte(secret), 0o600); err != nil {
			t.Fatal(err)
		}
		planted := map[string]func(p string) error{
			"atk-left-fifo":    func(p string) error { return syscall.Mkfifo(p, 0o600) },
			"atk-left-symlink": func(p string) error { return os.Symlink(victim, p) },
			"atk-left-zero":    func(p string) error { return os.Symlink("/dev/zero", p) },
		}
		was := map[string]api.Run{}
		for pid := range planted {
			chStart(t, d, pid, "idle", unit.Limits{})
			chSaid(t, d, pid, "idling")
		}
		// A daemon stopped while its start-up probe runs takes long to
		// stop: stopped once the probe is done.
		waitImageParks(t, d)
		mustStop(t, d)
		for pid, plant := range planted {
			p := filepath.Join(d.state, "ch", pid, "transcript")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := plant(p); err != nil {
				t.Fatal(err)
			}
		}
		mustStart(t, d)
		chServing(t, d)
		for pid := range planted {
			r, err := d.run(context.Background(), pid)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != "lost" || r.Segments != 0 {
				t.Errorf("run %s with a planted transcript: %+v, want lost with its record as it was", pid, r)
			}
			was[pid] = r
			chVerified(t, d, pid)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != secret {
			t.Errorf("the host file %s is now %q (%v)", victim, b, err)
		}
		// The unit's own attempt was refused by the read-only mount: the
		// channel died with the daemon, and the restarted one parks the
		// run from the transcript it holds, unaccounted.
		r := trParked(t, d, id, 2)
		s := mustShow(t, d, id)
		if got := trSealed(t, d, s.Segments[1]); got != "hostile line\n" {
			t.Errorf("recovery sealed %q, want what the unit appended", got)
		}
		chVerified(t, d, id)
		unchanged(t, d, id, r)
		for pid, r := range was {
			unchanged(t, d, pid, r)
		}
	})
	t.Run("Park", func(t *testing.T) {
		d := chShared(t)
		const id = "atk-fifo-park"
		chStart(t, d, id, "transcript-fifo", unit.Limits{}, "AWAIT=1")
		trParked(t, d, id, 2)
		s := mustShow(t, d, id)
		trCheckTranscript(t, d, s, "hostile line\n")
		chVerified(t, d, id)
		chServing(t, d)
	})
}

// chRSS is a process's resident set in bytes.
func chRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

func TestAttackChannelFlood(t *testing.T) {
	privileged(t)
	d := chOwnDaemon(t, "flood")
	const id = "atk-flood"
	before := chRSS(t, d.cmd.Process.Pid)
	chStart(t, d, id, "channel-flood", unit.Limits{}, "CONNS=64")
	conns := chSaid(t, d, id, "connections: ")
	chSaid(t, d, id, "holding ")
	grown := chRSS(t, d.cmd.Process.Pid) - before
	t.Logf("the daemon's resident set grew by %d KiB under the flood", grown>>10)
	def := unit.DefaultLimits
	// 64 connections: the default keeps 16 and refuses 48 with a line.
	if want := fmt.Sprintf("kept %d refused map[too_many_connections:%d]", def.ChannelConns, 64-def.ChannelConns); conns != want {
		t.Errorf("connections: %s, want %s", conns, want)
	}
	// What the unit makes the daemon hold is bounded by the bytes in
	// flight: 64 connections of 1 MiB held 64 MiB and more.
	if limit := int64(def.ChannelInflightBytes) + 24<<20; grown > limit {
		t.Errorf("the daemon's resident set grew by %d MiB under the flood (at most %d MiB allowed)", grown>>20, limit>>20)
	}
	chServing(t, d)
	// A park still records the interval.
	if _, err := d.c.Park(context.Background(), id); err != nil {
		t.Fatalf("park under the flood: %v", err)
	}
	chVerified(t, d, id)
}

func TestAttackChannelLimits(t *testing.T) {
	privileged(t)
	d := chShared(t)
	const id = "atk-limits"
	chStart(t, d, id, "channel-limits", unit.Limits{TranscriptBytes: 4096, IntervalCalls: 3, IntervalPayloadBytes: 16 << 10},
		"APPENDS=5", "BIG=20000")
	got := map[string]string{}
	// Not the await's answer: the daemon freezes the unit for its park
	// once it has said parking, and a loaded host may not run the unit
	// to print it first (the park itself, 2 segments, says it parked).
	for _, p := range []string{"appends: ", "big dispatch: ", "dispatches: "} {
		got[p] = chSaid(t, d, id, p)
	}
	want := map[string]string{
		"appends: ":      "ok ok ok ok transcript_full",
		"big dispatch: ": "payload_limit",
		"dispatches: ":   "ok ok ok too_many_calls",
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s%s, want %s", p, got[p], w)
		}
	}
	trParked(t, d, id, 2)
	s := mustShow(t, d, id)
	var transcript bytes.Buffer
	for i := range 4 {
		fmt.Fprintf(&transcript, "%04d%s\n", i, strings.Repeat("t", 1019))
	}
	trCheckTranscript(t, d, s, transcript.String())
	trCheckAccounts(t, s, []trAccount{{dispatched: []string{"c1", "c2", "c3"}}})
	chVerified(t, d, id)
	chServing(t, d)
}

func TestAttackLongCallID(t *testing.T) {
	privileged(t)
	d := chShared(t)
	const id = "atk-longid"
	call := strings.Repeat("i", 250)
	chStart(t, d, id, "long-call-id", unit.Limits{}, "IDLEN=250")
	trParked(t, d, id, 2)
	if cs := trCalls(t, d, id); len(cs) != 1 || cs[0].ID != call || cs[0].ResultPosted {
		t.Fatalf("calls %s, want the long one, no result yet", cs)
	}
	trPost(t, d, id, call, `{"long":true}`)
	if got := chSaid(t, d, id, "result: "); got != `ok=true err=ok payload={"long":true}` {
		t.Errorf("the unit got %s", got)
	}
	chVerified(t, d, id)
	chServing(t, d)
}

func TestAttackChannelPayload(t *testing.T) {
	privileged(t)
	d := chOwnDaemon(t, "payload")
	const id = "atk-payload"
	const mib = 96
	before := chRSS(t, d.cmd.Process.Pid)
	chStart(t, d, id, "channel-payload", unit.Limits{}, fmt.Sprintf("MIB=%d", mib))
	if got := chSaid(t, d, id, "appended "); got != strconv.Itoa(mib<<20) {
		t.Fatalf("the unit appended %s bytes, want %d", got, mib<<20)
	}
	grown := chRSS(t, d.cmd.Process.Pid) - before
	t.Logf("the daemon's resident set grew by %d KiB over %d MiB of appends", grown>>10, mib)
	if limit := int64(32 << 20); grown > limit {
		t.Errorf("the daemon's resident set grew by %d MiB over %d MiB of appends (at most %d MiB allowed): the interval's payload is held in memory", grown>>20, mib, limit>>20)
	}
	if _, err := d.c.Park(context.Background(), id); err != nil {
		t.Fatalf("park: %v", err)
	}
	s := mustShow(t, d, id)
	if got := len(trSealed(t, d, s.Segments[1])); got != mib<<20 {
		t.Errorf("the park sealed %d bytes, want %d", got, mib<<20)
	}
	chVerified(t, d, id)
	chServing(t, d)
}
