package criu

import (
	"os"
	"strings"
	"testing"
)

// A sandbox's own configuration left with the lazy-pages line (a daemon
// crashed between a lazy restore and its rewrite) is repaired to Conf;
// one that is Conf already, or absent, is left as it is.
func TestRepairConfOf(t *testing.T) {
	d := Dirs{State: t.TempDir()}
	if err := d.Make(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(d.Conf()); err != nil || string(b) != Conf {
		t.Fatalf("Conf %q, %v", b, err)
	}
	if repaired, err := d.RepairConfOf("sb"); repaired || err != nil {
		t.Fatalf("no file: repaired %v, %v", repaired, err)
	}
	if err := os.MkdirAll(d.Of("sb"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteConfOf("sb", LazyConf); err != nil {
		t.Fatal(err)
	}
	if repaired, err := d.RepairConfOf("sb"); !repaired || err != nil {
		t.Fatalf("lazy file: repaired %v, %v", repaired, err)
	}
	if b, err := os.ReadFile(d.ConfOf("sb")); err != nil || string(b) != Conf {
		t.Fatalf("repaired to %q, %v", b, err)
	}
	if repaired, err := d.RepairConfOf("sb"); repaired || err != nil {
		t.Fatalf("ordinary file: repaired %v, %v", repaired, err)
	}
	if !strings.HasPrefix(d.Dump("sb"), d.Of("sb")+"/") || !strings.HasPrefix(d.Restore("sb"), d.Of("sb")+"/") {
		t.Fatalf("work directories %s %s outside %s", d.Dump("sb"), d.Restore("sb"), d.Of("sb"))
	}
}

// The probe's logs say which patched fast paths CRIU took, and whether
// it went on without hardware breakpoints.
func TestProbeReadLogs(t *testing.T) {
	var p Probe
	p.ReadLogs([]byte("(00.1) /dev/shm: dumped without tar (3 entries)\n"))
	if len(p.Seen) != 1 || p.Seen[0] != TmpfsDump || len(p.Notes) != 0 {
		t.Fatalf("probe %+v", p)
	}
	p = Probe{}
	p.ReadLogs([]byte("Hardware breakpoints don't seem to work\nrestored without tar (2 entries)\ndumped without tar (1 entries)\n"))
	if len(p.Seen) != 2 || p.Seen[0] != TmpfsDump || p.Seen[1] != TmpfsRestore || len(p.Notes) != 1 {
		t.Fatalf("probe %+v", p)
	}
}
