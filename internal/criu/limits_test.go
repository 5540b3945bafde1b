package criu

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"google.golang.org/protobuf/proto"
)

const (
	rlimitCore   = 4
	rlimitNproc  = 6
	rlimitNofile = 7
	rlimitRtprio = 14
	unitOOM      = 1000
)

// unitLimits is a policy change: the limits and oom_score_adj a unit's
// spec sets (internal/executor's withUnitLimits), with pids 77.
func unitLimits(p *Policy) {
	inf := ^uint64(0)
	p.Rlimits = map[int]Rlimit{}
	for n := range 16 {
		p.Rlimits[n] = Rlimit{Soft: inf, Hard: inf}
	}
	p.Rlimits[3] = Rlimit{Soft: 8 << 20, Hard: inf}
	for n, v := range map[int]uint64{rlimitCore: 0, rlimitNproc: 77, rlimitNofile: 1024, 8: 8 << 20, 11: 1 << 16, 12: 819200, 13: 0, rlimitRtprio: 0} {
		p.Rlimits[n] = Rlimit{Soft: v, Hard: v}
	}
	oomScoreAdj(unitOOM)(p)
}

// TestNarrow rewrites one task's limits or oom_score_adj as an earlier
// runrecordd (or a signer) left them: the images pass the judge, and
// Narrow writes that task's core, and only it, with the spec's.
func TestNarrow(t *testing.T) {
	inf := ^uint64(0)
	type lim struct{ soft, hard uint64 }
	for _, c := range []struct {
		name   string
		change func(*testing.T, string)
		policy func(*Policy)
		task   uint32
		limits map[int]lim // the task's limits after Narrow
		oom    *int32      // its oom_score_adj after Narrow
	}{
		{"RlimitSoft", creds("1", func(c *criucore.CoreEntry) { c.Tc.Rlimits.Rlimits[rlimitNofile].Cur = proto.Uint64(1 << 20) }),
			nil, 1, map[int]lim{rlimitNofile: {1024, 1024}}, nil},
		{"Rlimit", creds("12", func(c *criucore.CoreEntry) {
			c.Tc.Rlimits.Rlimits[rlimitNofile].Cur, c.Tc.Rlimits.Rlimits[rlimitNofile].Max = proto.Uint64(1<<20), proto.Uint64(1<<20)
		}), nil, 12, map[int]lim{rlimitNofile: {1024, 1024}}, nil},
		{"RlimitMissing", creds("1", func(c *criucore.CoreEntry) { c.Tc.Rlimits.Rlimits = c.Tc.Rlimits.Rlimits[:rlimitNofile] }),
			nil, 1, map[int]lim{rlimitNofile: {1024, 1024}}, nil},
		{"RlimitsMissing", creds("12", func(c *criucore.CoreEntry) { c.Tc.Rlimits = nil }),
			unitLimits, 12, map[int]lim{0: {inf, inf}, 3: {8 << 20, inf}, rlimitNproc: {77, 77}, rlimitNofile: {1024, 1024}, 15: {inf, inf}}, proto.Int32(unitOOM)},
		{"RlimitUnset", creds("12", func(c *criucore.CoreEntry) {
			c.Tc.Rlimits.Rlimits[rlimitRtprio].Cur, c.Tc.Rlimits.Rlimits[rlimitRtprio].Max = proto.Uint64(99), proto.Uint64(99)
		}), func(p *Policy) { p.Rlimits[rlimitRtprio] = Rlimit{} }, 12, map[int]lim{rlimitRtprio: {0, 0}}, nil},
		{"SoftAboveHard", creds("1", func(c *criucore.CoreEntry) {
			c.Tc.Rlimits.Rlimits[rlimitNofile].Cur, c.Tc.Rlimits.Rlimits[rlimitNofile].Max = proto.Uint64(1000), proto.Uint64(10)
		}), nil, 1, map[int]lim{rlimitNofile: {10, 10}}, nil},
		// A park of an earlier runrecordd: the host's limits, a core
		// limit, the daemon's oom_score_adj.
		{"EarlierRunrecordd", creds("1", func(c *criucore.CoreEntry) {
			rl := c.Tc.Rlimits.Rlimits
			rl[rlimitNproc].Cur, rl[rlimitNproc].Max = proto.Uint64(96367), proto.Uint64(96367)
			rl[11].Cur, rl[11].Max = proto.Uint64(96367), proto.Uint64(96367)
			rl[rlimitCore].Cur, rl[rlimitCore].Max = proto.Uint64(0), proto.Uint64(inf)
			c.Tc.OomScoreAdj = proto.Int32(-998)
		}), unitLimits, 1, map[int]lim{rlimitNproc: {77, 77}, 11: {1 << 16, 1 << 16}, rlimitCore: {0, 0}, 3: {8 << 20, inf}}, proto.Int32(unitOOM)},
		{"OOMScoreAdj", creds("12", func(c *criucore.CoreEntry) { c.Tc.OomScoreAdj = proto.Int32(-1000) }),
			oomScoreAdj(unitOOM), 12, nil, proto.Int32(unitOOM)},
		{"OOMScoreAdjMissing", creds("1", func(c *criucore.CoreEntry) { c.Tc.OomScoreAdj = nil }),
			oomScoreAdj(unitOOM), 1, nil, proto.Int32(unitOOM)},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := oracle(t)
			c.change(t, dir)
			p := mustPolicy(t)
			if c.policy != nil {
				c.policy(&p)
			}
			other := uint32(1)
			if c.task == 1 {
				other = 12
			}
			otherName := filepath.Join(dir, "core-"+itoa(other)+".img")
			if c.policy != nil {
				// The other task is within the policy already: only
				// the changed one is written.
				narrowOnly(t, dir, other, p)
			}
			if err := os.Chmod(filepath.Join(dir, "core-"+itoa(c.task)+".img"), 0o400); err != nil {
				t.Fatal(err)
			}
			otherBefore, err := os.ReadFile(otherName)
			if err != nil {
				t.Fatal(err)
			}
			im, err := Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := im.Judge(p); err != nil {
				t.Fatalf("judged: %v", err)
			}
			if err := im.Narrow(dir, p); err != nil {
				t.Fatal(err)
			}
			after, err := Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := after.Judge(p); err != nil {
				t.Fatalf("narrowed images judged: %v", err)
			}
			tc := after.Cores[c.task].GetTc()
			rl := tc.GetRlimits().GetRlimits()
			for n, want := range c.limits {
				if n >= len(rl) {
					t.Fatalf("RLIMIT %d missing after Narrow (%d limits)", n, len(rl))
				}
				if got := (lim{rl[n].GetCur(), rl[n].GetMax()}); got != want {
					t.Errorf("RLIMIT %d: %d/%d, want %d/%d", n, got.soft, got.hard, want.soft, want.hard)
				}
			}
			for n, l := range p.Rlimits {
				if n >= len(rl) || rl[n].GetCur() > l.Hard || rl[n].GetMax() > l.Hard || rl[n].GetCur() > rl[n].GetMax() {
					t.Errorf("RLIMIT %d not within the spec's %d", n, l.Hard)
				}
			}
			if c.oom != nil && (tc.OomScoreAdj == nil || tc.GetOomScoreAdj() != *c.oom) {
				t.Errorf("oom_score_adj %v, want %d", tc.OomScoreAdj, *c.oom)
			}
			if b, err := os.ReadFile(otherName); err != nil || !bytes.Equal(b, otherBefore) {
				t.Errorf("core-%d.img rewritten (%v): only the narrowed task's core changes", other, err)
			}
			if fi, err := os.Stat(filepath.Join(dir, "core-"+itoa(c.task)+".img")); err != nil || fi.Mode().Perm() != 0o400 {
				t.Errorf("core-%d.img: %v, %v: its mode not kept", c.task, fi.Mode(), err)
			}
			// Narrowed again (a park of the restored unit), nothing
			// changes.
			b, err := os.ReadFile(filepath.Join(dir, "core-"+itoa(c.task)+".img"))
			if err != nil {
				t.Fatal(err)
			}
			if err := after.Narrow(dir, p); err != nil {
				t.Fatal(err)
			}
			if again, err := os.ReadFile(filepath.Join(dir, "core-"+itoa(c.task)+".img")); err != nil || !bytes.Equal(again, b) {
				t.Errorf("narrowed twice: the core changed again (%v)", err)
			}
		})
	}
}

// narrowOnly narrows task pid's core in dir under p beforehand.
func narrowOnly(t *testing.T, dir string, pid uint32, p Policy) {
	t.Helper()
	name := "core-" + itoa(pid) + ".img"
	rewrite(t, dir, name, &criucore.CoreEntry{}, func(c *criucore.CoreEntry) {
		if _, err := narrowTask(pid, name, c, p); err != nil {
			t.Fatal(err)
		}
	})
}

// TestNarrowNothing: the oracle, parked under the spec, is within it:
// Narrow writes nothing. Under a spec that grants CAP_SYS_RESOURCE (the
// unit sets its own limits), nothing is narrowed either.
func TestNarrowNothing(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*testing.T, string)
		policy func(*Policy)
	}{
		{"Oracle", func(*testing.T, string) {}, nil},
		{"SysResource", creds("1", func(c *criucore.CoreEntry) {
			c.Tc.Rlimits.Rlimits[rlimitNofile].Cur, c.Tc.Rlimits.Rlimits[rlimitNofile].Max = proto.Uint64(1<<20), proto.Uint64(1<<20)
			c.Tc.OomScoreAdj = proto.Int32(-1000)
		}), func(p *Policy) { unitLimits(p); p.Effective |= 1 << capSysResource }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := oracle(t)
			c.change(t, dir)
			p := mustPolicy(t)
			if c.policy != nil {
				c.policy(&p)
			}
			before := map[string][]byte{}
			des, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, de := range des {
				if before[de.Name()], err = os.ReadFile(filepath.Join(dir, de.Name())); err != nil {
					t.Fatal(err)
				}
			}
			im, err := Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := im.Judge(p); err != nil {
				t.Fatal(err)
			}
			if err := im.Narrow(dir, p); err != nil {
				t.Fatal(err)
			}
			for name, b := range before {
				if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(got, b) {
					t.Errorf("%s rewritten (%v)", name, err)
				}
			}
		})
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
