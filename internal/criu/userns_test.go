package criu

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/userns"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

const (
	nsSize = 65536
	nsBase = 1<<20 + 3*nsSize // the run's range on this host
)

// usernsPolicy is the policy of the sandbox spec in a user namespace
// mapped to host base.
func usernsPolicy(t *testing.T, base uint32) Policy {
	t.Helper()
	s := sandboxSpec(t)
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
	s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: nsSize}}
	s.Linux.GIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: nsSize}}
	p, err := PolicyOf(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// usernsImages is the oracle's images as a sandbox in a user namespace
// leaves them: its tasks in user namespace 99, whose maps are uid and
// gid (each an extent list) as a park stores them.
func usernsImages(t *testing.T, uid, gid []*userns.UidGidExtent) string {
	t.Helper()
	dir := oracle(t)
	for _, n := range []string{"ids-1.img", "ids-12.img"} {
		rewrite(t, dir, n, &criucore.TaskKobjIdsEntry{}, func(m *criucore.TaskKobjIdsEntry) { m.UserNsId = proto.Uint32(99) })
	}
	b, err := proto.Marshal(&userns.UsernsEntry{UidMap: uid, GidMap: gid})
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "userns-99.img", image(0x55474906, b))
	return dir
}

func ext(first, lower, count uint32) []*userns.UidGidExtent {
	return []*userns.UidGidExtent{{First: proto.Uint32(first), LowerFirst: proto.Uint32(lower), Count: proto.Uint32(count)}}
}

func judgeDir(t *testing.T, dir string, p Policy) error {
	t.Helper()
	im, err := Read(dir)
	if err != nil {
		return err
	}
	return im.Judge(p)
}

func wantRefused(t *testing.T, err error, image, field string) {
	t.Helper()
	var r *RefusedError
	if !errors.As(err, &r) || !errors.Is(err, ErrRefused) {
		t.Fatalf("got %v, want a refusal of %s %s", err, image, field)
	}
	if r.Image != image || r.Field != field {
		t.Fatalf("refused %s %q (%v), want %s %q", r.Image, r.Field, err, image, field)
	}
}

// TestRemapThenJudge: a park's maps (host base 0, or another host's
// range) are rewritten to this host's range, and then pass the judge;
// before the rewrite, they are refused, naming the map.
func TestRemapThenJudge(t *testing.T) {
	for _, from := range []uint32{0, 1<<20 + 7*nsSize} {
		dir := usernsImages(t, ext(0, from, nsSize), ext(0, from, nsSize))
		wantRefused(t, judgeDir(t, dir, usernsPolicy(t, nsBase)), "userns-99.img", "uid_map")
		if err := Remap(dir, nsBase, nsSize); err != nil {
			t.Fatal(err)
		}
		if err := judgeDir(t, dir, usernsPolicy(t, nsBase)); err != nil {
			t.Fatal(err)
		}
		// Another run's range is not this run's.
		wantRefused(t, judgeDir(t, dir, usernsPolicy(t, nsBase+nsSize)), "userns-99.img", "uid_map")
	}
}

// TestRemapRefuses: Remap rewrites only the one shape a sandbox here
// has: one image, one extent per map, of the range's size from 0.
func TestRemapRefuses(t *testing.T) {
	two := append(ext(0, 0, 1000), ext(1000, 5000, nsSize-1000)...)
	for _, c := range []struct {
		name       string
		dir        func(t *testing.T) string
		image, fld string
	}{
		{"None", func(t *testing.T) string { return oracle(t) }, "userns", ""},
		{"Two", func(t *testing.T) string {
			dir := usernsImages(t, ext(0, 0, nsSize), ext(0, 0, nsSize))
			write(t, dir, "userns-100.img", image(0x55474906))
			return dir
		}, "userns", ""},
		{"TwoExtents", func(t *testing.T) string { return usernsImages(t, two, ext(0, 0, nsSize)) }, "userns-99.img", "uid_map"},
		{"NotFromZero", func(t *testing.T) string { return usernsImages(t, ext(0, 0, nsSize), ext(1, 0, nsSize)) }, "userns-99.img", "gid_map"},
		{"Wider", func(t *testing.T) string { return usernsImages(t, ext(0, 0, 1<<31), ext(0, 0, nsSize)) }, "userns-99.img", "uid_map"},
		{"NoGidMap", func(t *testing.T) string { return usernsImages(t, ext(0, 0, nsSize), nil) }, "userns-99.img", "gid_map"},
		{"Garbage", func(t *testing.T) string {
			dir := oracle(t)
			write(t, dir, "userns-99.img", image(0x55474906, []byte{0xff, 0xff}))
			return dir
		}, "userns-99.img", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantRefused(t, Remap(c.dir(t), nsBase, nsSize), c.image, c.fld)
		})
	}
}

// TestRemapReplaces: the image is replaced, not written through: a
// restore's tree links the store's objects, which stay as they were.
func TestRemapReplaces(t *testing.T) {
	dir := usernsImages(t, ext(0, 0, nsSize), ext(0, 0, nsSize))
	kept := filepath.Join(t.TempDir(), "object")
	if err := os.Link(filepath.Join(dir, "userns-99.img"), kept); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	if err := Remap(dir, nsBase, nsSize); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Fatal("Remap wrote through a link")
	}
}

// TestJudgeUserns: in a user namespace, a park made without one (the
// images have none) is refused naming userns; without one in the spec,
// images with a user namespace are refused; ids are in-namespace ids.
func TestJudgeUserns(t *testing.T) {
	wantRefused(t, judgeDir(t, oracle(t), usernsPolicy(t, nsBase)), "userns", "")
	dir := usernsImages(t, ext(0, nsBase, nsSize), ext(0, nsBase, nsSize))
	wantRefused(t, judgeDir(t, dir, mustPolicy(t)), "userns-99.img", "")
	// A task of the namespace may hold any in-namespace id; a host id
	// (the range's own base) is not one.
	creds("12", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Uid = proto.Uint32(nsSize - 2) })(t, dir)
	if err := judgeDir(t, dir, usernsPolicy(t, nsBase)); err != nil {
		t.Fatal(err)
	}
	creds("12", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Uid = proto.Uint32(nsBase) })(t, dir)
	wantRefused(t, judgeDir(t, dir, usernsPolicy(t, nsBase)), "core-12.img", "creds.uid")
	// The images' user namespace must be the root task's.
	dir = usernsImages(t, ext(0, nsBase, nsSize), ext(0, nsBase, nsSize))
	rename(t, dir, "userns-99.img", "userns-98.img")
	wantRefused(t, judgeDir(t, dir, usernsPolicy(t, nsBase)), "userns-99.img", "")
}

// TestPolicyOfUserns: a spec's maps must be one extent from 0.
func TestPolicyOfUserns(t *testing.T) {
	s := sandboxSpec(t)
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
	s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 1, HostID: nsBase, Size: nsSize}}
	s.Linux.GIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: nsBase, Size: nsSize}}
	if _, err := PolicyOf(s); err == nil {
		t.Fatal("a map not from 0 made a policy")
	}
}
