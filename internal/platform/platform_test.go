package platform

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Books kept are read back by the next process; a damaged book stops the
// host rather than hand a run to nobody.
func TestBooks(t *testing.T) {
	dir := t.TempDir()
	a, b := record.Sum([]byte("a")), record.Sum([]byte("b"))
	books, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for run, key := range map[string]record.Address{"r1": a, "r2": b, "r3": a} {
		if err := books.Keep(run, key); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"", "../x", ".hidden", "a/b"} {
		if err := books.Keep(bad, a); err == nil {
			t.Errorf("Keep(%q) booked", bad)
		}
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Runs(a); len(got) != 2 || got[0] != "r1" || got[1] != "r3" {
		t.Errorf("Runs(a) = %v", got)
	}
	if !again.Owns(b, "r2") || again.Owns(a, "r2") || again.Owns(a, "r9") {
		t.Error("Owns disagrees with the books")
	}
	// A dropped book is gone, here and at the next open.
	if err := again.Drop("r3"); err != nil || again.Owns(a, "r3") {
		t.Fatalf("Drop(r3): %v; owned after: %v", err, again.Owns(a, "r3"))
	}
	if err := again.Drop("never-booked"); err != nil {
		t.Errorf("Drop of no book: %v", err)
	}
	if err := again.Drop("../x"); err == nil {
		t.Error("Drop(../x) took a path outside the books")
	}
	if reopened, err := Open(dir); err != nil || reopened.Owns(a, "r3") || !reopened.Owns(a, "r1") {
		t.Fatalf("the books after a drop: %v", err)
	}
	// Books of runs that do not exist are pruned; the others stay.
	if err := again.Prune(func(run string) bool { return run == "r1" }); err != nil {
		t.Fatal(err)
	}
	if reopened, err := Open(dir); err != nil || !reopened.Owns(a, "r1") || reopened.Owns(b, "r2") {
		t.Fatalf("the books after a prune: r1 %v, r2 %v, %v", reopened.Owns(a, "r1"), reopened.Owns(b, "r2"), err)
	}
	if err := os.WriteFile(filepath.Join(dir, "r4"), []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil {
		t.Error("a damaged book was read")
	}
}

// Booked reads one run's book without the books open: its key, the zero
// address for a run with none, an error for a damaged one.
func TestBooked(t *testing.T) {
	state := t.TempDir()
	books, err := Open(Dir(state))
	if err != nil {
		t.Fatal(err)
	}
	a := record.Sum([]byte("a"))
	if err := books.Keep("r1", a); err != nil {
		t.Fatal(err)
	}
	if key, err := Booked(state, "r1"); err != nil || key != a {
		t.Fatalf("Booked(r1) = %s, %v", key, err)
	}
	if key, err := Booked(state, "r2"); err != nil || key != (record.Address{}) {
		t.Fatalf("Booked(r2), not booked = %s, %v", key, err)
	}
	if _, err := Booked(state, "../r1"); err == nil {
		t.Error("Booked(../r1) read outside the books")
	}
	if err := os.WriteFile(filepath.Join(Dir(state), "r3"), []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Booked(state, "r3"); err == nil {
		t.Error("a damaged book was read")
	}
}

// A platform run's grants are judged as a bundle's over the platform's
// allow-list (empty: no mount at all), then its quotas.
func TestCheck(t *testing.T) {
	allowed := t.TempDir()
	l := Limits{Runs: 2, StoreBytes: 100}
	mount := unit.Grants{ReadOnly: []unit.Mount{{Source: allowed, Target: "/data"}}}
	if err := l.Check(l.Policy("/var/lib/runrecordd"), mount, Held{}); !errors.Is(err, bundle.ErrPolicy) {
		t.Errorf("a mount with no allow-list: %v, want ErrPolicy", err)
	}
	l.Mounts = []string{allowed}
	p := l.Policy("/var/lib/runrecordd")
	if err := l.Check(p, mount, Held{}); err != nil {
		t.Errorf("an allowed mount: %v", err)
	}
	if err := l.Check(p, unit.Grants{ReadOnly: []unit.Mount{{Source: "/etc", Target: "/etc"}}}, Held{}); !errors.Is(err, bundle.ErrPolicy) {
		t.Errorf("a mount outside the allow-list: %v", err)
	}
	for _, held := range []Held{{Runs: 2}, {StoreBytes: 100}} {
		if err := l.Check(p, unit.Grants{}, held); !errors.Is(err, ErrQuota) {
			t.Errorf("held %+v: %v, want ErrQuota", held, err)
		}
	}
	if err := l.Check(p, unit.Grants{}, Held{Runs: 1, StoreBytes: 99}); err != nil {
		t.Errorf("under both quotas: %v", err)
	}
}

// A platform run's egress grant is held to the host's ceiling, as the
// operator's: refused with none, taken within it.
func TestCheckEgress(t *testing.T) {
	g := unit.Grants{Network: unit.Egress, Egress: []unit.Dest{{CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"}}}
	l := Limits{Runs: 2, StoreBytes: 100}
	if err := l.Check(l.Policy("/var/lib/runrecordd"), g, Held{}); !errors.Is(err, bundle.ErrPolicy) {
		t.Errorf("egress with no ceiling: %v, want ErrPolicy", err)
	}
	l.EgressAllow = []netip.Prefix{netip.MustParsePrefix("203.0.0.0/8")}
	if err := l.Check(l.Policy("/var/lib/runrecordd"), g, Held{}); err != nil {
		t.Errorf("egress within the ceiling: %v", err)
	}
	l.EgressAllow = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	if err := l.Check(l.Policy("/var/lib/runrecordd"), g, Held{}); !errors.Is(err, bundle.ErrPolicy) {
		t.Errorf("egress beyond the ceiling: %v, want ErrPolicy", err)
	}
}
