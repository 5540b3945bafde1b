//go:build linux

package executor_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

// hostIDs is the unit's uid_map and its host uid and capability sets,
// as the host sees its process pid.
func hostIDs(t *testing.T, pid uint32) (uidMap string, status map[string]string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	status = map[string]string{}
	for _, l := range strings.Split(string(st), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			status[k] = strings.TrimSpace(v)
		}
	}
	return strings.Join(strings.Fields(string(b)), " "), status
}

// wantRange checks that the unit runs as the range's root: its uid map
// is the range, its host uid its base, with no capability past the
// spec's and in seccomp filter mode.
func wantRange(t *testing.T, s *executor.Sandbox, r idmap.Range, caps string) {
	t.Helper()
	m, st := hostIDs(t, s.Pid())
	if want := fmt.Sprintf("0 %d %d", r.Base, idmap.Size); m != want {
		t.Fatalf("uid_map %q, want %q", m, want)
	}
	if want := fmt.Sprintf("%d", r.Base); !strings.HasPrefix(st["Uid"], want+"\t") && st["Uid"] != strings.Repeat(want+"\t", 3)+want {
		t.Fatalf("host Uid %q, want %d", st["Uid"], r.Base)
	}
	if st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" {
		t.Fatalf("Seccomp %q NoNewPrivs %q", st["Seccomp"], st["NoNewPrivs"])
	}
	if caps != "" && st["CapEff"] != caps {
		t.Fatalf("CapEff %s, at the start %s", st["CapEff"], caps)
	}
}

// TestUserNamespace: a unit in a user namespace runs as its range's root
// on the host; its checkpoint holds no host id (the user namespace image
// at base 0, the rw layer in in-namespace ids); it restores, eagerly and
// lazily (with deploy/criu/5-lazy-pages-userns-uffd.patch), into another
// range (a migration's target) and goes on there.
func TestUserNamespace(t *testing.T) {
	privileged(t)
	out := outputs(t, "oracle")
	spec := oracleSpec()
	from := idmap.Range{Base: 1<<20 + 40*idmap.Size}
	spec.UserNS = &from
	const id = "userns"
	s := mustStart(t, id, spec, out)
	waitLines(t, out.Stdout, "a verified line", func(ls []line) bool { return len(ls) > 0 && last(ls).VerifiedAt >= 3 })
	_, st := hostIDs(t, s.Pid())
	caps := st["CapEff"]
	wantRange(t, s, from, caps)

	for i, lazy := range []bool{false, true} {
		ok := t.Run(map[bool]string{false: "eager", true: "lazy"}[lazy], func(st *testing.T) {
			if lazy {
				// CRIU opens the restored tasks' userfaultfds in the
				// unit's user namespace.
				needsPatch(st, criu.UsernsUffd)
			}
			s = restoreUserNS(st, t, userNSRestore{id: id, spec: spec, s: s, out: out, to: idmap.Range{Base: 1<<20 + uint32(41+i)*idmap.Size}, lazy: lazy, caps: caps})
		})
		if !ok {
			return
		}
	}
}

// userNSRestore is one restore of TestUserNamespace: the sandbox s
// parked away and restored, eagerly or lazily, into the range to.
type userNSRestore struct {
	id   string
	spec executor.Spec
	s    *executor.Sandbox
	out  executor.Output
	to   idmap.Range
	lazy bool
	caps string
}

// restoreUserNS parks r.s away and restores it into r.to; the sandbox
// restored is destroyed at the end of the whole test (parent).
func restoreUserNS(t, parent *testing.T, r userNSRestore) *executor.Sandbox {
	t.Helper()
	ctx := context.Background()
	cp, atDump := checkpointAway(t, r.s, r.out)
	if u := usernsImage(t, cp.ImageDir); u != "0 0 65536" {
		t.Fatalf("the park's user namespace image maps %q, want host base 0", u)
	}
	wantInNamespace(t, cp.Rootfs)
	spec := r.spec
	spec.UserNS = &r.to
	var s *executor.Sandbox
	var err error
	if r.lazy {
		var lp *pageserver.LazyPages
		s, lp, _, err = client.RestoreLazy(ctx, r.id, spec, cp, r.out)
		if err == nil {
			parent.Cleanup(func() { _, _ = lp.Result() })
		}
	} else {
		s, _, err = client.Restore(ctx, r.id, spec, cp, r.out)
	}
	if err != nil {
		t.Fatalf("lazy %v: %v", r.lazy, err)
	}
	parent.Cleanup(func() { destroy(parent, s) })
	ls := waitLines(t, r.out.Stdout, "a line verified after the restore", func(ls []line) bool {
		return last(ls).VerifiedAt > atDump.Counter
	})
	if l := last(ls); !l.FileOK || l.LoUp {
		t.Fatalf("lazy %v: after the restore %+v", r.lazy, l)
	}
	wantRange(t, s, r.to, r.caps)
	if u := usernsImage(t, cp.ImageDir); u != "0 0 65536" {
		t.Fatalf("the restore changed the park's image: %q", u)
	}
	return s
}

// TestUserNamespaceRefusesHostRootPark: a park made without a user
// namespace does not restore into one: image_refused, naming userns,
// before CRIU runs; the park stays whole.
func TestUserNamespaceRefusesHostRootPark(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	out := outputs(t, "oracle")
	spec := oracleSpec()
	const id = "userns-old"
	s := mustStart(t, id, spec, out)
	waitLines(t, out.Stdout, "a line", func(ls []line) bool { return len(ls) > 0 })
	cp := parkAway(t, s)
	r := idmap.Range{Base: 1<<20 + 44*idmap.Size}
	spec.UserNS = &r
	_, _, err := client.Restore(ctx, id, spec, cp, out)
	var refused *criu.RefusedError
	if !errors.As(err, &refused) || refused.Image != "userns" {
		t.Fatalf("got %v, want a refusal naming userns", err)
	}
	spec.UserNS = nil
	s, _, err = client.Restore(ctx, id, spec, cp, out)
	if err != nil {
		t.Fatal("the park did not stay whole:", err)
	}
	destroy(t, s)
}

// usernsImage is the uid map of the one user namespace image in dir.
func usernsImage(t *testing.T, dir string) string {
	t.Helper()
	im, err := criu.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Userns) != 1 {
		t.Fatalf("%d user namespace images", len(im.Userns))
	}
	for _, u := range im.Userns {
		var s []string
		for _, e := range u.GetUidMap() {
			s = append(s, fmt.Sprintf("%d %d %d", e.GetFirst(), e.GetLowerFirst(), e.GetCount()))
		}
		return strings.Join(s, ", ")
	}
	return ""
}

// wantInNamespace checks that every member of the rw layer tar at path
// is owned by an in-namespace id.
func wantInNamespace(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if h.Uid >= idmap.Size || h.Gid >= idmap.Size {
			t.Fatalf("%s owned by %d:%d, a host id", filepath.Clean(h.Name), h.Uid, h.Gid)
		}
	}
	if n == 0 {
		t.Fatal("an empty rw layer: the oracle writes files")
	}
}

// TestProbeUserNS: with a range to probe in, the probe also dumps and
// restores a container in a user namespace mapped to it, as a sandbox
// with one is, and says that it passed.
func TestProbeUserNS(t *testing.T) {
	privileged(t)
	cfg := client.Config()
	cfg.ProbeUserNS = &idmap.Range{Base: 1<<20 + 41*idmap.Size}
	c, err := executor.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.Probe(context.Background(), time.Minute)
	if !p.OK || !p.UserNSTried || !p.UserNS || p.UserNSReason != "" {
		t.Fatalf("probe %+v", p)
	}
	t.Logf("probe took %v", p.Took)
}
