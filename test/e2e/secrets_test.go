//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// secretOf is what the oracle reports of a secret's value (its "secret").
func secretOf(v string) string {
	h := uint64(14695981039346656037)
	for _, c := range []byte(v) {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return fmt.Sprintf("%016x:%d", h, len(v))
}

// TestSecrets runs the oracle with a secret given on run's command line
// (from the environment), and follows it: the unit reads the value at
// /run/secrets/TOKEN before and after a park; the grant set names it;
// no byte of the value is in the exported bundle, the store, any other
// file of the daemon's or its log. On a second host the resume is
// refused (secrets_required) and changes nothing until resume --secret
// gives the value again. Then a run parked for the next start: resumed
// at that start while the host still holds its values, and left parked,
// with a warning, once they are gone (a reboot empties the tmpfs).
func TestSecrets(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := mustDaemon(t, "secrets-a")
	mustImportImage(t, a, oracleArchive, oracleImage, oracleDigest)
	var rb [16]byte
	_, _ = rand.Read(rb[:])
	value := "rr-secret-" + hex.EncodeToString(rb[:])
	want := secretOf(value)
	const id = "secret"

	cmd := exec.Command(daemonBinary, "run", "--socket", a.socket, "--id", id, "--cpu", "1000", "--memory", "256Mi",
		"--env", "SIZE_MB=64", "--env", "VERIFY_EVERY=5", "--env", "SECRET_FILE=/run/secrets/TOKEN", "--secret", "TOKEN", oracleImage)
	cmd.Env = append(os.Environ(), "TOKEN="+value)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run --secret TOKEN: %v: %s", err, out)
	}
	closeAtEnd(t, a, id)
	waitLines(t, a.stdout(id), "the secret read", func(ls []line) bool {
		return len(ls) > 0 && last(ls).Secret == want
	})
	s := mustShow(t, a, id)
	if s.Grants == nil || !slices.Equal(s.Grants.Secrets, []string{"TOKEN"}) {
		t.Fatalf("the grant set's secrets: %+v", s.Grants)
	}

	_, atPark := park(t, a, id)
	resumed := time.Now()
	resume(t, a, id, nil, atPark)
	waitLines(t, a.stdout(id), "the secret read after the resume", func(ls []line) bool {
		l := last(ls)
		return l.Time > resumed.UnixNano() && l.VerifiedAt > atPark.Counter && l.Secret == want
	})
	_, atPark = park(t, a, id)

	bundle := filepath.Join(t.TempDir(), "secret.bundle")
	f, err := os.Create(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.c.Export(ctx, id, f); err != nil {
		t.Fatalf("export: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Run("NoValueStored", func(t *testing.T) {
		b, err := os.ReadFile(bundle)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 64<<20 || bytes.Contains(b, []byte(value)) {
			t.Fatalf("the bundle (%d bytes) holds the value: %v", len(b), bytes.Contains(b, []byte(value)))
		}
		show, _ := json.Marshal(mustShow(t, a, id))
		if bytes.Contains(show, []byte(value)) {
			t.Fatal("show holds the value")
		}
		for _, p := range filesHolding(t, a.root, value) {
			t.Errorf("%s holds the value", p)
		}
	})

	b := mustDaemon(t, "secrets-b")
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
	mustImportImage(t, b, oracleArchive, oracleImage, oracleDigest)
	was, err := b.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.c.Resume(ctx, id)
	ae := apiError(t, err, api.CodeSecretsRequired)
	if ae.Status != 422 || !strings.Contains(ae.Message, "TOKEN") {
		t.Fatalf("resume without the secret: %d %v", ae.Status, ae)
	}
	unchanged(t, b, id, was)
	_, err = b.c.ResumeWith(ctx, id, api.ResumeRequest{Secrets: map[string]string{"TOKEN": value, "OTHER": "x"}})
	apiError(t, err, api.CodeBadRequest)
	unchanged(t, b, id, was)

	resumed = time.Now()
	if out, err := exec.Command(daemonBinary, "resume", id, "--socket", b.socket, "--secret", "TOKEN="+value).CombinedOutput(); err != nil {
		t.Fatalf("resume --secret on the second host: %v: %s", err, out)
	}
	ls := waitLines(t, b.stdout(id), "the secret read on the second host", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atPark.Counter && last(ls).Secret == want
	})
	if l := last(ls); l.Pid != atPark.Pid || l.StartTime != atPark.StartTime {
		t.Fatalf("not the same process on the second host: %+v, parked %+v", l, atPark)
	}

	t.Run("ComeBack", func(t *testing.T) { comebackSecrets(t, a, value) })
}

// comebackSecrets parks a run with a secret for the next start (park
// --all), restarts the daemon: the run comes back; then again with the
// secrets tmpfs unmounted, as a reboot leaves it: the run stays parked.
func comebackSecrets(t *testing.T, d *daemon, value string) {
	ctx := context.Background()
	const id = "secret-comeback"
	r, err := d.c.Start(ctx, api.RunRequest{ID: id,
		Unit:    unit.Spec{Image: oracleImage, Env: append(slices.Clone(oracleEnv), "SECRET_FILE=/run/secrets/K")},
		Grants:  unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork},
		Secrets: map[string]string{"K": value}})
	if err != nil || r.Phase != "executing" {
		t.Fatalf("start: %+v %v", r, err)
	}
	closeAtEnd(t, d, id)
	want := secretOf(value)
	waitLines(t, d.stdout(id), "the secret read", func(ls []line) bool { return len(ls) > 0 && last(ls).Secret == want })
	parkForStart := func() {
		t.Helper()
		if _, err := d.c.ParkAll(ctx, api.ParkAllRequest{}); err != nil {
			t.Fatal(err)
		}
		mustStop(t, d)
	}
	parkForStart()
	mustStart(t, d)
	waitPhase(t, d, id, "executing")

	parkForStart()
	secrets := filepath.Join(d.state, "secrets")
	if err := syscall.Unmount(secrets, 0); err != nil {
		t.Fatal(err)
	}
	mustStart(t, d)
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(d.logTail(), "needs its secrets again") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning in the log: %s", d.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r, err := d.run(ctx, id); err != nil || r.Phase != "parked" {
		t.Fatalf("after a start without the values: %+v %v", r, err)
	}
	if _, err := d.c.ResumeWith(ctx, id, api.ResumeRequest{Secrets: map[string]string{"K": value}}); err != nil {
		t.Fatal(err)
	}
}

// waitPhase waits up to a minute for run id to be in phase.
func waitPhase(t *testing.T, d *daemon, id, phase string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := d.run(context.Background(), id)
		if err == nil && r.Phase == phase {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: %+v %v, want %s; log: %s", id, r, err, phase, d.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// filesHolding lists the regular files under root, on root's own file
// system (not the secrets tmpfs, nor a sandbox's mounts), that hold v,
// and the daemon's log among them.
func filesHolding(t *testing.T, root, v string) []string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(root, &st); err != nil {
		t.Fatal(err)
	}
	var out []string
	n := 0
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if e.IsDir() {
			var ds syscall.Stat_t
			if syscall.Stat(p, &ds) == nil && ds.Dev != st.Dev {
				return filepath.SkipDir
			}
			return nil
		}
		if !e.Type().IsRegular() {
			return nil
		}
		n++
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(v)) {
			out = append(out, p)
		}
		return nil
	})
	if err != nil || n < 10 {
		t.Fatalf("walked %d files under %s: %v", n, root, err)
	}
	return out
}

// TestFleetMigrateSecrets migrates an executing run with a secret: no
// value travels, so the target, having claimed it, refuses its resume
// (secrets_required) and hands it back. The migration answers the
// target's secrets_required; the run is the source's again — owned there
// in the directory, not handed off — and the source, which still holds
// the value, has resumed it: the unit goes on as the same process,
// reading the same secret.
func TestFleetMigrateSecrets(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, keyA := f.host(t, "fleet-secrets-a")
	b, keyB := f.host(t, "fleet-secrets-b")
	const id, value = "moving-secret", "rr-migrated-secret"
	started := startSecretOracle(t, a, id, value)
	want := secretOf(value)

	_, err := a.c.Migrate(ctx, id, keyB)
	answered := time.Now()
	ae := apiError(t, err, api.CodeSecretsRequired)
	if !strings.Contains(ae.Message, "TOKEN") || strings.Contains(ae.Message, value) || !strings.Contains(ae.Message, "runs here again") {
		t.Fatalf("migrate: %v, want the target's refusal naming TOKEN, and the unit running on A again", ae)
	}
	r, err := a.run(ctx, id)
	if err != nil || r.Phase != "executing" || r.HandedOff {
		t.Fatalf("on A: %+v, %v; want executing there, not handed off", r, err)
	}
	if rb, err := b.run(ctx, id); err != nil || !rb.HandedOff {
		t.Fatalf("on B: %+v, %v; want handed off", rb, err)
	}
	e, err := f.dir(t).Run(ctx, genesisOf(t, started))
	if err != nil || e.Owner.String() != keyA || !e.To.IsZero() || e.Head.String() != r.Head {
		t.Fatalf("directory %+v, %v; want owned by A at %s", e, err, r.Head)
	}
	ls := waitLines(t, a.stdout(id), "the secret read after the migration failed", func(ls []line) bool {
		l := last(ls)
		return l.Time > answered.UnixNano() && l.Secret == want
	})
	checkOneProcess(t, ls)
}

// startSecretOracle starts the oracle as run id on d, reading its secret
// TOKEN, of value, at /run/secrets/TOKEN, and waits for its first line
// verified that reports it.
func startSecretOracle(t *testing.T, d *daemon, id, value string) api.Run {
	t.Helper()
	started, err := d.c.Start(context.Background(), api.RunRequest{ID: id,
		Unit:    unit.Spec{Image: oracleImage, Env: append(slices.Clone(oracleEnv), "SECRET_FILE=/run/secrets/TOKEN")},
		Grants:  unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork},
		Secrets: map[string]string{"TOKEN": value}})
	if err != nil {
		t.Fatalf("start %s on the %s daemon: %v", id, d.name, err)
	}
	closeAtEnd(t, d, id)
	want := secretOf(value)
	waitLines(t, d.stdout(id), "the secret read", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > 0 && last(ls).Secret == want
	})
	return started
}

// TestFleetDrainSecrets drains a host running a run with a secret to two
// others: the first the drain places it on refuses its resume
// (secrets_required) and hands it back, parked; the drain tries the next,
// which takes it parked, as a parked run migrates. There its resume is
// refused secrets_required, the run parked as it was, until a resume
// gives the value: the unit reads it again, as the same process.
func TestFleetDrainSecrets(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.host(t, "drain-secrets-a")
	b, _ := f.host(t, "drain-secrets-b")
	c, _ := f.host(t, "drain-secrets-c")
	const id, value = "drained-secret", "rr-drained-secret"
	startSecretOracle(t, a, id, value)
	want := secretOf(value)
	drained, err := a.c.Drain(ctx, api.DrainRequest{})
	if err != nil || drained.Moved != 1 || drained.Left != 0 {
		t.Fatalf("drain: %+v, %v\n%s", drained, err, a.logTail())
	}
	t.Logf("drain: %+v", drained)
	atPark := last(output(t, a.stdout(id)))
	if r, err := a.run(ctx, id); err != nil || !r.HandedOff {
		t.Fatalf("on the drained host: %+v, %v", r, err)
	}
	d, r := holder(t, id, b, c)
	if r.Phase != "parked" {
		t.Fatalf("on %s: %+v, want parked", d.name, r)
	}
	other := map[*daemon]*daemon{b: c, c: b}[d]
	if ro, err := other.run(ctx, id); err != nil || !ro.HandedOff {
		t.Fatalf("on %s, the host that handed it back: %+v, %v", other.name, ro, err)
	}
	_, err = d.c.Resume(ctx, id)
	apiError(t, err, api.CodeSecretsRequired)
	if now, err := d.run(ctx, id); err != nil || now.Phase != "parked" || now.Head != r.Head {
		t.Fatalf("after the refused resume on %s: %+v, %v", d.name, now, err)
	}
	resumed := time.Now()
	if _, err := d.c.ResumeWith(ctx, id, api.ResumeRequest{Secrets: map[string]string{"TOKEN": value}}); err != nil {
		t.Fatalf("resume with the value on %s: %v", d.name, err)
	}
	ls := waitLines(t, d.stdout(id), "the secret read after the resume", func(ls []line) bool {
		if len(ls) == 0 { // a lazy resume answers before the unit's first line here
			return false
		}
		l := last(ls)
		return l.Time > resumed.UnixNano() && l.VerifiedAt > atPark.Counter && l.Secret == want
	})
	checkOneProcess(t, append(output(t, a.stdout(id)), ls...))
}
