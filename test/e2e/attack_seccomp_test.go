//go:build linux

package e2e

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/seccomp"
	"google.golang.org/protobuf/proto"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// TestAttackImagesSeccomp: the restored unit's authority (docs/trust.md,
// "What a restore may grant"). The hostile unit ("authority") reports
// each thread's seccomp mode, whether add_key (refused by the spec's
// profile, allowed to the host's root) works, its oom_score_adj,
// RLIMIT_CORE and every limit of /proc/self/limits. Parked on A and
// exported, its images are rewritten by a trusted signer (A's key) and
// imported by B: an allow-all seccomp.img resumes, and the unit is still
// refused add_key on every thread (B stacks the spec's filter); a lower
// oom_score_adj, higher or missing limits resume with the spec's (B
// narrows them); threads with no filter of their own (TSYNC taken off
// their leader's) are refused before anything runs. The true park
// resumes on B under the same authority as on A.
func TestAttackImagesSeccomp(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := mustDaemon(t, "seccomp-a")
	b := mustDaemon(t, "seccomp-b")
	for _, d := range []*daemon{a, b} {
		mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	}
	trustHost(t, a, b)
	const id = "authority"
	startHostile(t, a, id, "authority", nil, unit.Grants{})
	onA := authorityReport(t, a, id, 0)
	t.Logf("on A: %+v", onA)
	onA.confined(t, "on A", onA.limits)
	// The spec's limits, as runc set them: a few of them known.
	if l := strings.Split(onA.limits, ","); len(l) != 16 || l[4] != "0/0" || l[7] != "1024/1024" || l[11] != "65536/65536" || l[13] != "0/0" {
		t.Fatalf("on A: limits %s, not the spec's", onA.limits)
	}
	if _, err := a.c.Park(ctx, id); err != nil {
		t.Fatalf("park: %v", err)
	}
	var buf bytes.Buffer
	if err := a.c.Export(ctx, id, &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	truth := readBundle(t, buf.Bytes())
	key := hostKey(t, a)

	allowAll := []byte{0x06, 0, 0, 0, 0, 0, 0xff, 0x7f} // BPF_RET|BPF_K SECCOMP_RET_ALLOW
	filters := func(change func(*seccomp.SeccompFilter)) func(t *testing.T, name string, img []byte) []byte {
		return func(t *testing.T, name string, img []byte) []byte {
			if name != "seccomp.img" {
				return nil
			}
			return eachMessage(t, img, func() *seccomp.SeccompEntry { return &seccomp.SeccompEntry{} }, func(e *seccomp.SeccompEntry) {
				for _, f := range e.SeccompFilters {
					change(f)
				}
			})
		}
	}
	leader := func(change func(*criucore.CoreEntry)) func(t *testing.T, name string, img []byte) []byte {
		return func(t *testing.T, name string, img []byte) []byte {
			if name != "core-1.img" {
				return nil
			}
			return eachMessage(t, img, func() *criucore.CoreEntry { return &criucore.CoreEntry{} }, change)
		}
	}

	// Allow-all filters: resumed, under the spec's filter all the same.
	const open = "authority-allow-all"
	if _, err := importRaw(b, forgeImages(t, truth, key, open, filters(func(f *seccomp.SeccompFilter) { f.Filter = allowAll })), open); err != nil {
		t.Fatalf("import: %v", err)
	}
	if _, err := b.c.Resume(ctx, open); err != nil {
		t.Fatalf("resume of the allow-all images: %v", err)
	}
	closeAtEnd(t, b, open)
	got := authorityReport(t, b, open, onA.n)
	t.Logf("allow-all images resumed on B: %+v", got)
	got.confined(t, "allow-all images resumed", onA.limits)

	// A lower oom_score_adj, higher limits (the host's, as an earlier
	// runrecordd's park has them), none: resumed with the spec's.
	for _, c := range []struct {
		name   string
		change func(t *testing.T, name string, img []byte) []byte
	}{
		{"OOMScoreAdj", leader(func(c *criucore.CoreEntry) { c.Tc.OomScoreAdj = proto.Int32(-1000) })},
		{"Limits", leader(func(c *criucore.CoreEntry) {
			rl := c.Tc.Rlimits.Rlimits
			rl[4].Max = proto.Uint64(^uint64(0))                            // RLIMIT_CORE
			rl[6].Cur, rl[6].Max = proto.Uint64(96367), proto.Uint64(96367) // RLIMIT_NPROC
			rl[7].Cur, rl[7].Max = proto.Uint64(1<<20), proto.Uint64(1<<20) // RLIMIT_NOFILE
		})},
		{"NoLimits", leader(func(c *criucore.CoreEntry) { c.Tc.Rlimits, c.Tc.OomScoreAdj = nil, nil })},
	} {
		t.Run(c.name, func(t *testing.T) {
			fid := "authority-" + strings.ToLower(c.name)
			if _, err := importRaw(b, forgeImages(t, truth, key, fid, c.change), fid); err != nil {
				t.Fatalf("import: %v", err)
			}
			if _, err := b.c.Resume(ctx, fid); err != nil {
				t.Fatalf("resume: %v", err)
			}
			closeAtEnd(t, b, fid)
			got := authorityReport(t, b, fid, onA.n)
			t.Logf("resumed on B: %+v", got)
			got.confined(t, "resumed", onA.limits)
		})
	}

	for _, c := range []struct {
		name, field string
		change      func(t *testing.T, name string, img []byte) []byte
	}{
		{"ThreadsWithoutFilter", "thread_core.seccomp_mode", filters(func(f *seccomp.SeccompFilter) { f.Flags = proto.Uint32(f.GetFlags() &^ 1) })},
	} {
		t.Run(c.name, func(t *testing.T) {
			fid := "authority-" + strings.ToLower(c.name)
			if _, err := importRaw(b, forgeImages(t, truth, key, fid, c.change), fid); err != nil {
				t.Fatalf("import: %v", err)
			}
			was, err := b.run(ctx, fid)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.c.Resume(ctx, fid)
			ae := apiError(t, err, api.CodeImageRefused)
			if !strings.Contains(ae.Message, ": "+c.field+": ") || !strings.Contains(ae.Message, "task ") {
				t.Fatalf("refused, not naming a task and %s: %v", c.field, ae)
			}
			t.Logf("refused: %s", ae.Message)
			unchanged(t, b, fid, was)
			if out, err := os.ReadFile(b.stdout(fid)); err == nil && len(out) > 0 {
				t.Fatalf("the refused unit wrote %d bytes", len(out))
			}
		})
	}

	// The true park, resumed on B: the same process, as confined.
	if _, err := importRaw(b, buf.Bytes(), ""); err != nil {
		t.Fatalf("import of the true bundle: %v", err)
	}
	if _, err := b.c.Resume(ctx, id); err != nil {
		t.Fatalf("resume of the true park: %v", err)
	}
	closeAtEnd(t, b, id)
	got = authorityReport(t, b, id, onA.n)
	t.Logf("true park resumed on B: %+v", got)
	got.confined(t, "true park resumed", onA.limits)
}

// report is one report of the "authority" attack.
type report struct {
	n                                  int
	seccomp, addKey, oom, core, limits string
}

var reportRE = regexp.MustCompile(`^hostile: authority: report (\d+) seccomp=(\S*) add_key=(\S+) oom_score_adj=(\S+) core=(\S+) limits=(\S+)$`)

// authorityReport waits for a report of run id on d numbered past after
// (a restored unit goes on counting) and returns the last one.
func authorityReport(t *testing.T, d *daemon, id string, after int) report {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(d.stdout(id))
		var last *report
		for _, l := range strings.Split(string(b), "\n") {
			m := reportRE.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			n, _ := strconv.Atoi(m[1])
			if n > after {
				last = &report{n: n, seccomp: m[2], addKey: m[3], oom: m[4], core: m[5], limits: m[6]}
			}
		}
		if last != nil {
			return *last
		}
		if time.Now().After(deadline) {
			t.Fatalf("no report of %s past %d: stdout %q", id, after, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// confined checks that every thread is in seccomp filter mode, add_key
// is refused (EPERM, the profile's answer), oom_score_adj is the units',
// core dumps are off and every limit (/proc/self/limits) is limits.
func (r report) confined(t *testing.T, when, limits string) {
	t.Helper()
	if r.seccomp == "" {
		t.Fatalf("%s: no thread's seccomp mode read", when)
	}
	for i, m := range strings.Split(r.seccomp, ",") {
		if m != "2" {
			t.Errorf("%s: thread %d in seccomp mode %s, want 2 (%s)", when, i, m, r.seccomp)
		}
	}
	if r.addKey != "operation_not_permitted" {
		t.Errorf("%s: add_key answered %s, want EPERM from the spec's filter", when, r.addKey)
	}
	if r.oom != strconv.Itoa(executor.UnitOOMScoreAdj) {
		t.Errorf("%s: oom_score_adj %s, want %d", when, r.oom, executor.UnitOOMScoreAdj)
	}
	if r.core != "0/0" {
		t.Errorf("%s: RLIMIT_CORE %s, want 0/0", when, r.core)
	}
	if r.limits != limits {
		t.Errorf("%s: limits %s, want %s", when, r.limits, limits)
	}
}
