//go:build linux

package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// TestRwLayerIDs: the rw layer carries in-namespace ids only, and each
// host puts its own range into them (docs/trust.md, "A sandbox in a user
// namespace"). A unit on host A makes files owned by its root and by its
// uid 1000, and sets a file capability (stored by the kernel with the
// host id of the namespace's root). Parked and exported, the bundle's rw
// layer holds 0, 1000 and a capability of root id 0: no id of A's range.
// Imported on B, where the run gets another range, and resumed: the unit
// sees 0:0, 1000:1000 and its capability as before, and on B's disk the
// files belong to B's range's base and base+1000, the capability to its
// base. The same bundle with an owner past the range, re-signed by A, is
// refused on B with image_refused naming the rw layer, before anything
// runs, and stays parked.
func TestRwLayerIDs(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := mustDaemon(t, "rwlayer-a")
	b := mustDaemon(t, "rwlayer-b")
	for _, d := range []*daemon{a, b} {
		mustImportImage(t, d, hostileArchive, hostileImage, hostileDigest)
	}
	trustHost(t, a, b)
	g := unit.Grants{MemoryBytes: 256 << 20}
	const id = "rwlayer"
	startHostile(t, a, id, "owners", nil, g)
	const seen = "seen: /owned-root=0:0 /owned-1000=1000:1000 cap=20"
	if got := waitSaid(t, a, id, "owners", "seen:"); got != seen {
		t.Fatalf("on A the unit says %q, want %q", got, seen)
	}
	baseA := hostOwners(t, a, id)

	if _, err := a.c.Park(ctx, id); err != nil {
		t.Fatalf("park: %v", err)
	}
	var buf bytes.Buffer
	if err := a.c.Export(ctx, id, &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	truth := readBundle(t, buf.Bytes())
	var layer []byte
	for _, o := range truth.Objects {
		if layerOwners(t, o.Bytes) != nil {
			layer = o.Bytes
		}
	}
	if layer == nil {
		t.Fatal("no rw layer in the bundle holds the unit's files")
	}
	got := layerOwners(t, layer)
	want := map[string]string{"owned-root": "0:0", "owned-1000": "1000:1000", "owned-cap": "0:0 rootid 0"}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("the bundle's rw layer: %s is %q, want %q (A's range is at %d)", name, got[name], w, baseA)
		}
	}
	rewriteLayer(t, layer, func(h *tar.Header) {
		if h.Uid >= 1<<16 || h.Gid >= 1<<16 {
			t.Errorf("the bundle's rw layer: %s is owned by %d:%d, past the namespace's ids", h.Name, h.Uid, h.Gid)
		}
	})

	// B's first range is held by another run: the moved one gets another.
	startHostile(t, b, "rwlayer-other", "idle", nil, g)
	waitSaid(t, b, "rwlayer-other", "idle", "idling")
	if _, err := importRaw(b, buf.Bytes(), ""); err != nil {
		t.Fatalf("import: %v", err)
	}
	if _, err := b.c.Resume(ctx, id); err != nil {
		t.Fatalf("resume on B: %v", err)
	}
	if got := nextSaid(t, b, id, "owners", "seen:"); got != seen {
		t.Fatalf("resumed on B the unit says %q, want %q", got, seen)
	}
	if baseB := hostOwners(t, b, id); baseB == baseA {
		t.Fatalf("the run has range %d on both hosts", baseA)
	}

	// A layer with an owner past the range, as A could sign it.
	const fid = "rwlayer-forged"
	raw := forgeSnapshot(t, truth, hostKey(t, a), fid, forgery{rootfs: func(t *testing.T, layer []byte) []byte {
		return rewriteLayer(t, layer, func(h *tar.Header) {
			if path.Base(h.Name) == "owned-1000" {
				h.Uid = 1 << 16
			}
		})
	}})
	if _, err := importRaw(b, raw, fid); err != nil {
		t.Fatalf("import of the re-signed bundle: %v", err)
	}
	was, err := b.run(ctx, fid)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.c.Resume(ctx, fid)
	ae := apiError(t, err, api.CodeImageRefused)
	if !strings.Contains(ae.Message, ": rw layer: uid: ") {
		t.Fatalf("refused, not naming the rw layer's uid: %v", ae)
	}
	t.Logf("refused: %s", ae.Message)
	unchanged(t, b, fid, was)
	if was.Status != "parked (image)" {
		t.Fatalf("after the refusal: %+v", was)
	}
	if out, err := os.ReadFile(b.stdout(fid)); err == nil && len(out) > 0 {
		t.Fatalf("the refused unit wrote %d bytes", len(out))
	}
}

// hostOwners checks, from the host, the files the "owners" unit of run
// id on d made: owned by its range's base and base+1000, the capability's
// root id the base; it returns the base.
func hostOwners(t *testing.T, d *daemon, id string) uint32 {
	t.Helper()
	pid := strings.Fields(sandboxCgroupFile(t, d, "pids", id, "cgroup.procs"))[0]
	m, err := os.ReadFile("/proc/" + pid + "/uid_map")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(m))
	if len(f) != 3 || f[0] != "0" || f[2] != "65536" {
		t.Fatalf("uid_map %q, want one range of 65536 ids", m)
	}
	base, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil || base == 0 {
		t.Fatalf("uid_map %q: not a range of the host's", m)
	}
	root := "/proc/" + pid + "/root"
	for name, off := range map[string]uint64{"owned-root": 0, "owned-1000": 1000, "owned-cap": 0} {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(root, name), &st); err != nil {
			t.Fatal(err)
		}
		if uint64(st.Uid) != base+off || uint64(st.Gid) != base+off {
			t.Errorf("on the %s host, %s is owned by %d:%d, want %d", d.name, name, st.Uid, st.Gid, base+off)
		}
	}
	c := make([]byte, 64)
	n, err := unix.Getxattr(filepath.Join(root, "owned-cap"), "security.capability", c)
	if err != nil {
		t.Fatal(err)
	}
	if n != 24 || c[3] != 3 || uint64(binary.LittleEndian.Uint32(c[20:])) != base {
		t.Errorf("on the %s host, owned-cap's capability is %x, want revision 3 with root id %d", d.name, c[:n], base)
	}
	return uint32(base)
}

// layerOwners is, for each file of the "owners" unit in the tar b, its
// owner (and its capability's root id); nil when b is no tar holding
// them.
func layerOwners(t *testing.T, b []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil
		}
		name := path.Base(h.Name)
		if !strings.HasPrefix(name, "owned-") {
			continue
		}
		out[name] = fmt.Sprintf("%d:%d", h.Uid, h.Gid)
		if c := h.PAXRecords["SCHILY.xattr.security.capability"]; c != "" {
			if len(c) != 24 || c[3] != 3 {
				t.Fatalf("the rw layer's %s has capability %x, want revision 3", name, c)
			}
			out[name] += fmt.Sprintf(" rootid %d", binary.LittleEndian.Uint32([]byte(c[20:])))
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// rewriteLayer is the tar layer with change applied to every header.
func rewriteLayer(t *testing.T, layer []byte, change func(*tar.Header)) []byte {
	t.Helper()
	var out bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(layer)), tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		change(h)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// nextSaid waits for a "hostile: ATTACK: " line starting with prefix that
// run id on d writes from now on, and returns the rest of it.
func nextSaid(t *testing.T, d *daemon, id, attack, prefix string) string {
	t.Helper()
	want := "hostile: " + attack + ": " + prefix
	count := func() (int, string) {
		b, _ := os.ReadFile(d.stdout(id))
		n, last := 0, ""
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, want); ok {
				n, last = n+1, prefix+rest
			}
		}
		return n, last
	}
	before, _ := count()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if n, last := count(); n > before {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for a new %q from %s", want, id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
