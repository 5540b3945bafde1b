//go:build linux

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	ghostfile "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/ns"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	skopts "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-opts"
	skunix "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// TestAttackImages: a trusted signer rewrites a parked oracle's CRIU
// images (docs/trust.md, "What a restore may grant"), one field at a
// time, and re-signs the run with its own key, as host A can. Host B
// trusts A and imports each bundle: its resume is refused with
// image_refused naming the field, before anything runs (no output, the
// run parked as it was); and the true park, imported beside them,
// resumes and goes on as the same process.
func TestAttackImages(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := shared(t)
	b := mustDaemon(t, "images")
	mustImportImage(t, b, oracleArchive, oracleImage, oracleDigest)
	trustHost(t, a, b)
	const id = "images"
	startOracle(t, a, id, oracleImage)
	_, atPark := park(t, a, id)
	onA := output(t, a.stdout(id))
	var buf bytes.Buffer
	if err := a.c.Export(ctx, id, &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	truth := readBundle(t, buf.Bytes())
	key := hostKey(t, a)

	for _, c := range imageForgeries() {
		t.Run(c.name, func(t *testing.T) {
			fid := "images-" + strings.ToLower(c.name)
			raw := forgeImages(t, truth, key, fid, c.change)
			if _, err := importRaw(b, raw, fid); err != nil {
				t.Fatalf("import of the re-signed bundle: %v", err)
			}
			was, err := b.run(ctx, fid)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.c.Resume(ctx, fid)
			ae := apiError(t, err, api.CodeImageRefused)
			if !strings.Contains(ae.Message, ": "+c.field+": ") {
				t.Fatalf("refused, not naming %s: %v", c.field, ae)
			}
			t.Logf("refused: %s", ae.Message)
			unchanged(t, b, fid, was)
			if was.Status != "parked (image)" {
				t.Fatalf("after the refusal: %+v", was)
			}
			if out, err := os.ReadFile(b.stdout(fid)); err == nil && len(out) > 0 {
				t.Fatalf("the refused unit wrote %d bytes", len(out))
			}
		})
	}

	// The chunk index of the park's slab form (docs/store.md, "Slabs"),
	// forged: the import is refused, malformed, and stores no run.
	for name, forge := range map[string]func(cs []store.SlabChunk){
		"SlabRangesOverlap": func(cs []store.SlabChunk) {
			for i := range cs {
				if cs[i].Address != cs[0].Address {
					cs[i].Slab, cs[i].Offset = cs[0].Slab, cs[0].Offset
					return
				}
			}
		},
		"SlabRangePastItsEnd": func(cs []store.SlabChunk) { cs[len(cs)-1].Offset += 1 << 40 },
		"ChunksOverlap":       func(cs []store.SlabChunk) { cs[1].Vaddr = cs[0].Vaddr },
	} {
		t.Run(name, func(t *testing.T) {
			fid := "images-" + strings.ToLower(name)
			raw := forgeImages(t, truth, key, fid, func(t *testing.T, n string, img []byte) []byte {
				if !strings.HasSuffix(n, store.SlabSuffix+"/"+store.SlabIndexBase) || img == nil {
					return nil
				}
				cs, err := store.DecodeSlabIndex(img, []uint64{1 << 62})
				if err != nil || len(cs) < 2 {
					t.Fatalf("the true index: %d chunks, %v", len(cs), err)
				}
				forge(cs)
				return store.EncodeSlabIndex(cs)
			})
			_, err := importRaw(b, raw, fid)
			ae := apiError(t, err, api.CodeBadRequest)
			if !strings.Contains(ae.Message, "chunked file refused") {
				t.Fatalf("refused, not as a chunked file: %v", ae)
			}
			t.Logf("refused: %s", ae.Message)
			if _, err := b.run(ctx, fid); err == nil {
				t.Fatal("the refused import stored the run")
			}
		})
	}

	// The true park: imported as it was exported, it passes the check
	// and goes on.
	if _, err := importRaw(b, buf.Bytes(), ""); err != nil {
		t.Fatalf("import of the true bundle: %v", err)
	}
	resume(t, b, id, onA, atPark)
}

// forgeImages is the bundle of run truth as a signer holding key would
// forge it under run id: a unit of its own (its nonce drawn from id, so a
// record of its own), its memory image with every image change returns
// bytes for replaced, and the interval that parked it signed again over
// the new park.
func forgeImages(t *testing.T, truth *bundletest.Bundle, key ed25519.PrivateKey, id string,
	change func(t *testing.T, name string, img []byte) []byte) []byte {
	t.Helper()
	return forgeSnapshot(t, truth, key, id, forgery{image: change})
}

// forgery is what forgeSnapshot changes of a park: image returns the
// bytes of a CRIU image it replaces (nil: kept), rootfs the rw layer's tar
// (nil: kept); a nil func keeps that tree whole.
type forgery struct {
	image  func(t *testing.T, name string, img []byte) []byte
	rootfs func(t *testing.T, layer []byte) []byte
}

// forgeSnapshot is forgeImages with the rw layer (the root tree's
// rootfs.tar) forged too, as f says.
func forgeSnapshot(t *testing.T, truth *bundletest.Bundle, key ed25519.PrivateKey, id string, f forgery) []byte {
	t.Helper()
	rec := truth.Record
	ex, susp := rec.Segment(rec.Len()-2), rec.Segment(rec.Len()-1)
	if rec.Len() != 2 || ex.Kind != record.Executed || susp.Kind != record.Suspended || susp.Snapshot.Memory == nil || susp.Snapshot.Root == nil {
		t.Fatalf("not a run parked once: %d segments", rec.Len())
	}
	out := &bundletest.Bundle{Run: id}
	drop := map[record.Address]bool{rec.Unit(): true, susp.Manifest: true, ex.Attestation: true}

	spec, err := unit.DecodeSpec(truth.Object(rec.Unit()))
	if err != nil {
		t.Fatal(err)
	}
	sum := record.Sum([]byte(id))
	spec.Nonce = hex.EncodeToString(sum[:16])
	sb, err := spec.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	unitID := out.Add(sb)

	m, err := manifest.Decode(truth.Object(susp.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	m[manifest.UnitID] = unitID.String()
	mb, err := m.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	man := out.Add(mb)

	memory, root := *susp.Snapshot.Memory, *susp.Snapshot.Root
	lf := listingForger{t: t, truth: truth, out: out, drop: drop}
	if f.image != nil {
		memory = lf.forge(memory, absentImages, func(name string, b []byte) []byte {
			if b != nil && strings.HasPrefix(name, "pages-") && !strings.HasSuffix(name, store.SlabSuffix+"/"+store.SlabIndexBase) {
				return nil
			}
			return f.image(t, name, b)
		})
	}
	if f.rootfs != nil {
		root = lf.forge(root, nil, func(name string, b []byte) []byte {
			if name != "rootfs.tar" {
				return nil
			}
			return f.rootfs(t, b)
		})
	}
	snap := record.ImageSnapshot(root, &memory)

	forged := record.New(unitID, rec.Grants())
	parked := record.Suspension(snap, man)
	body, err := attest.Open(truth.Object(ex.Attestation), nil)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := parked.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	body.Genesis, body.PrevHead, body.Outcome.Suspends = forged.Genesis(), forged.Head(), record.Sum(pc)
	signed, err := attest.Sign(body, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []record.Segment{record.Execution(out.Add(signed.Encode()), ex.Calls), parked} {
		if _, err := forged.Append(s); err != nil {
			t.Fatal(err)
		}
	}
	// An object comes after those it refers to: truth's kept ones first.
	var kept []bundletest.Object
	for _, o := range truth.Objects {
		if !drop[o.Addr] {
			kept = append(kept, o)
		}
	}
	out.Objects = append(kept, out.Objects...)
	out.Record = forged
	return out.Tar(nil)
}

// listingForger forges listings of truth's into out, and marks what
// they replace in drop.
type listingForger struct {
	t          *testing.T
	truth, out *bundletest.Bundle
	drop       map[record.Address]bool
}

// forge is the address of the listing at addr with every file change
// returns bytes for replaced, added to out; what it replaces is dropped.
// change is also asked about each name of absent the listing lacks, with
// b nil: bytes it returns add that file. No file changed fails the test.
func (f listingForger) forge(addr record.Address, absent []string, change func(name string, b []byte) []byte) record.Address {
	t, truth, out, drop := f.t, f.truth, f.out, f.drop
	t.Helper()
	es, err := store.DecodeListing(truth.Object(addr))
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for i, e := range es {
		b := change(e.Name, truth.Object(e.Address))
		if b == nil {
			continue
		}
		drop[e.Address] = true
		es[i].Address, es[i].Size = out.Add(b), uint64(len(b))
		changed++
	}
	for _, name := range absent {
		if slices.ContainsFunc(es, func(e store.Entry) bool { return e.Name == name }) {
			continue
		}
		if b := change(name, nil); b != nil {
			es = append(es, store.Entry{Name: name, Mode: 0o600, Size: uint64(len(b)), Address: out.Add(b)})
			changed++
		}
	}
	if changed == 0 {
		t.Fatalf("nothing of listing %s changed", addr)
	}
	lb, err := store.EncodeListing(es)
	if err != nil {
		t.Fatal(err)
	}
	drop[addr] = true
	return out.Add(lb)
}

// eachMessage rewrites every message of a CRIU image (magics, then
// messages each framed by its u32 little-endian length) with change. The
// inventory has one magic, its own; every other image two.
func eachMessage[M proto.Message](t *testing.T, img []byte, fresh func() M, change func(M)) []byte {
	t.Helper()
	if len(img) < 8 {
		t.Fatalf("an image of %d bytes", len(img))
	}
	magics := 8
	if binary.LittleEndian.Uint32(img) == 0x58313116 { // the inventory's
		magics = 4
	}
	out := append([]byte(nil), img[:magics]...)
	for p := img[magics:]; len(p) > 0; {
		n := binary.LittleEndian.Uint32(p)
		m := fresh()
		if err := proto.Unmarshal(p[4:4+n], m); err != nil {
			t.Fatal(err)
		}
		p = p[4+n:]
		change(m)
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

// setCredsExtra sets the creds fields CRIU 4.2 has and go-criu's protos
// lack: no_new_privs (18) and cap_amb (19).
func setCredsExtra(c *criucore.CoreEntry, nnp uint64, amb ...uint64) {
	var b []byte
	b = protowire.AppendTag(b, 18, protowire.VarintType)
	b = protowire.AppendVarint(b, nnp)
	for _, a := range amb {
		b = protowire.AppendTag(b, 19, protowire.VarintType)
		b = protowire.AppendVarint(b, a)
	}
	c.ThreadCore.Creds.ProtoReflect().SetUnknown(b)
}

// TestImageCheckGrants: a unit with a read-only grant (a bind mount the
// images key by its place, which runc maps to the host path at each
// restore) passes the image check, parked and resumed on its own host.
func TestImageCheckGrants(t *testing.T) {
	privileged(t)
	d := shared(t)
	const id = "images-grant"
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "f"), []byte("granted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := d.c.Start(context.Background(), api.RunRequest{ID: id,
		Unit: unit.Spec{Image: oracleImage, Env: oracleEnv},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork,
			ReadOnly: []unit.Mount{{Source: data, Target: "/data"}}}})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	closeAtEnd(t, d, id)
	waitLines(t, d.stdout(id), "the oracle's first verified line", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > 0
	})
	_, atPark := park(t, d, id)
	resume(t, d, id, nil, atPark)
}

// imageForgery is one field of a CRIU image rewritten: change returns the
// bytes of an image it replaces (nil: kept), and the refusal must name
// field.
type imageForgery struct {
	name, field string
	change      func(t *testing.T, name string, img []byte) []byte
}

// imageForgeries are the image fields a forger rewrites, and the images
// it adds, one per case (docs/trust.md, "What a restore may grant"):
// each is refused.
func imageForgeries() []imageForgery {
	cores := func(change func(*criucore.CoreEntry)) func(t *testing.T, name string, img []byte) []byte {
		return func(t *testing.T, name string, img []byte) []byte {
			if name != "core-1.img" {
				return nil
			}
			return eachMessage(t, img, func() *criucore.CoreEntry { return &criucore.CoreEntry{} }, change)
		}
	}
	full := []uint32{0xffffffff, 0x1ff}
	return []imageForgery{
		{"CapEff", "creds.cap_eff", cores(func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapEff = full })},
		{"CapPrm", "creds.cap_prm", cores(func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapPrm = full })},
		{"CapBnd", "creds.cap_bnd", cores(func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapBnd = full })},
		{"CapInh", "creds.cap_inh", cores(func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapInh = full })},
		{"CapAmb", "creds.cap_amb", cores(func(c *criucore.CoreEntry) { setCredsExtra(c, 1, 1<<21) })},
		{"NoNewPrivs", "creds.no_new_privs", cores(func(c *criucore.CoreEntry) { setCredsExtra(c, 0, 0) })},
		{"Securebits", "creds.secbits", cores(func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Secbits = proto.Uint32(0x2f) })},
		// Ids past the run's range (a sandbox maps 0-65535 in its user
		// namespace): ids that no task of its could hold.
		{"Uid", "creds.uid", cores(func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Uid = proto.Uint32(65536) })},
		{"Groups", "creds.groups", cores(func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Groups = []uint32{0, 65536} })},
		{"Seccomp", "thread_core.seccomp_mode", cores(func(c *criucore.CoreEntry) {
			c.ThreadCore.SeccompMode, c.ThreadCore.SeccompFilter = criucore.SeccompMode_disabled.Enum(), nil
		})},
		{"Namespace", "net_ns_id", func(t *testing.T, name string, img []byte) []byte {
			if !strings.HasPrefix(name, "ids-") {
				return nil
			}
			return eachMessage(t, img, func() *criucore.TaskKobjIdsEntry { return &criucore.TaskKobjIdsEntry{} },
				func(m *criucore.TaskKobjIdsEntry) { m.NetNsId = proto.Uint32(2) }) // the inventory's: CRIU's own
		}},
		{"Mount", "mnt_entry.mountpoint", func(t *testing.T, name string, img []byte) []byte {
			if !strings.HasPrefix(name, "mountpoints-") {
				return nil
			}
			return eachMessage(t, img, func() *mnt.MntEntry { return &mnt.MntEntry{} }, func(m *mnt.MntEntry) {
				if m.GetMountpoint() == "/run" {
					m.Mountpoint, m.Fstype, m.Source = proto.String("/host"), proto.Uint32(0), proto.String("/dev/sda1")
				}
			})
		}},
		{"FilePath", "reg.name", func(t *testing.T, name string, img []byte) []byte {
			if name != "files.img" {
				return nil
			}
			return eachMessage(t, img, func() *fdinfo.FileEntry { return &fdinfo.FileEntry{} }, func(f *fdinfo.FileEntry) {
				if f.GetReg().GetName() == "/tmp/oracle.dat" {
					f.Reg.Name = proto.String("../../../../etc/shadow")
				}
			})
		}},
		{"FileKind", "type", func(t *testing.T, name string, img []byte) []byte {
			if name != "files.img" {
				return nil
			}
			return eachMessage(t, img, func() *fdinfo.FileEntry { return &fdinfo.FileEntry{} }, func(f *fdinfo.FileEntry) {
				if f.GetReg().GetName() == "/tmp/oracle.dat" {
					f.Type, f.Reg = fdinfo.FdTypes_TUNF.Enum(), nil
				}
			})
		}},
		// The inventory's root ids are CRIU's own namespaces: made the
		// root task's (ids-1.img, which the listing's order gives first),
		// the task's own namespaces read as the host's.
		{"Inventory", "pid_ns_id", func() func(t *testing.T, name string, img []byte) []byte {
			var root []byte
			return func(t *testing.T, name string, img []byte) []byte {
				switch name {
				case "ids-1.img":
					root = img
				case "inventory.img":
					if root == nil {
						t.Fatal("the inventory before the root task's ids")
					}
					ids := &criucore.TaskKobjIdsEntry{}
					eachMessage(t, root, func() *criucore.TaskKobjIdsEntry { return ids }, func(*criucore.TaskKobjIdsEntry) {})
					return eachMessage(t, img, func() *inventory.InventoryEntry { return &inventory.InventoryEntry{} },
						func(m *inventory.InventoryEntry) { m.RootIds = ids })
				}
				return nil
			}
		}()},
		{"Pstree", "threads", func(t *testing.T, name string, img []byte) []byte {
			if name != "pstree.img" {
				return nil
			}
			return eachMessage(t, img, func() *pstree.PstreeEntry { return &pstree.PstreeEntry{} }, func(m *pstree.PstreeEntry) {
				m.Threads = slices.DeleteFunc(m.Threads, func(tid uint32) bool { return tid == m.GetPid() })
			})
		}},
		{"ExeFile", "exe_file_id", func(t *testing.T, name string, img []byte) []byte {
			if !strings.HasPrefix(name, "mm-") {
				return nil
			}
			return eachMessage(t, img, func() *mm.MmEntry { return &mm.MmEntry{} }, func(m *mm.MmEntry) { m.ExeFileId = proto.Uint32(99999) })
		}},
		{"Cwd", "cwd_id", func(t *testing.T, name string, img []byte) []byte {
			if !strings.HasPrefix(name, "fs-") {
				return nil
			}
			return eachMessage(t, img, func() *fs.FsEntry { return &fs.FsEntry{} }, func(m *fs.FsEntry) { m.CwdId = proto.Uint32(99999) })
		}},
		{"Descriptor", "id", func(t *testing.T, name string, img []byte) []byte {
			if !strings.HasPrefix(name, "fdinfo-") {
				return nil
			}
			return eachMessage(t, img, func() *fdinfo.FdinfoEntry { return &fdinfo.FdinfoEntry{} }, func(m *fdinfo.FdinfoEntry) { m.Id = proto.Uint32(99999) })
		}},
		{"Cgroup", "sets.ctls.path", func(t *testing.T, name string, img []byte) []byte {
			if name != "cgroup.img" {
				return nil
			}
			return eachMessage(t, img, func() *cgroup.CgroupEntry { return &cgroup.CgroupEntry{} }, func(m *cgroup.CgroupEntry) {
				for _, set := range m.Sets {
					for _, c := range set.Ctls {
						c.Path = proto.String("/")
					}
				}
			})
		}},
		{"Descriptors", "descriptors.json", func(t *testing.T, name string, img []byte) []byte {
			if name != "descriptors.json" {
				return nil
			}
			return []byte(`["/dev/null","pipe:[1]","pipe:[2]","/etc/shadow"]`)
		}},
		{"TmpfsThroughItsLink", "name", func(t *testing.T, name string, img []byte) []byte {
			if !strings.HasPrefix(name, "tmpfs-dev-") {
				return nil
			}
			return tgz(t, &tar.Header{Name: "./etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
				&tar.Header{Name: "./etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644})
		}},
		{"TmpfsHardLinkOut", "linkname", func(t *testing.T, name string, img []byte) []byte {
			if !strings.HasPrefix(name, "tmpfs-dev-") {
				return nil
			}
			return tgz(t, &tar.Header{Name: "./shadow", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow"})
		}},
		// Images the park lacks (absentImages), added.
		{"TmpfsAbsolute", "name", adding("tmpfs-99.tar.gz.img", func(t *testing.T) []byte {
			return tgz(t, &tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644})
		})},
		{"RegFile", "name", adding("reg-files.img", func(t *testing.T) []byte {
			zero := proto.Uint32(0)
			return newImage(t, 0x50363636, &regfile.RegFileEntry{Id: proto.Uint32(99999), Flags: zero, Pos: proto.Uint64(0),
				Fown: fileOwner(), Name: proto.String("../../../../etc/shadow")})
		})},
		{"UnixSocket", "name", adding("unixsk.img", func(t *testing.T) []byte {
			zero := proto.Uint32(0)
			return newImage(t, 0x54373943, &skunix.UnixSkEntry{Id: proto.Uint32(99999), Ino: proto.Uint32(99999), Type: proto.Uint32(1),
				State: proto.Uint32(1), Flags: zero, Uflags: zero, Backlog: zero, Peer: zero, Fown: fileOwner(),
				Opts: &skopts.SkOptsEntry{SoSndbuf: zero, SoRcvbuf: zero, SoSndTmoSec: proto.Uint64(0), SoSndTmoUsec: proto.Uint64(0),
					SoRcvTmoSec: proto.Uint64(0), SoRcvTmoUsec: proto.Uint64(0)},
				Name: []byte("../../run/containerd/containerd.sock")})
		})},
		{"NamespaceFile", "ns_id", adding("ns-files.img", func(t *testing.T) []byte {
			return newImage(t, 0x61394011, &ns.NsFileEntry{Id: proto.Uint32(99999), NsId: proto.Uint32(99999),
				NsCflag: proto.Uint32(0x40000000), Flags: proto.Uint32(0)}) // CLONE_NEWNET
		})},
		// A deleted file remade as a socket: no kind a sandbox makes.
		{"GhostFile", "mode", adding("ghost-file-1f.img", func(t *testing.T) []byte {
			return newImage(t, 0x52583605, &ghostfile.GhostFileEntry{Uid: proto.Uint32(0), Gid: proto.Uint32(0), Mode: proto.Uint32(0o140644)})
		})},
		{"SharedMemory", "pages-shmem-1.img", adding("pages-shmem-1.img", func(*testing.T) []byte { return make([]byte, 4096) })},
		{"NotAnImage", "evil.img", adding("evil.img", func(*testing.T) []byte { return []byte("x") })},
	}
}

// absentImages are the images a forgery may add to a park that lacks
// them (forgeImages asks its change about each, with img nil).
var absentImages = []string{"tmpfs-99.tar.gz.img", "reg-files.img", "unixsk.img", "ns-files.img", "ghost-file-1f.img",
	"pages-shmem-1.img", "evil.img"}

// adding is the change that adds image name, of the bytes b returns, to
// a park that lacks it.
func adding(name string, b func(t *testing.T) []byte) func(t *testing.T, name string, img []byte) []byte {
	return func(t *testing.T, n string, img []byte) []byte {
		if n != name || img != nil {
			return nil
		}
		return b(t)
	}
}

// newImage is a CRIU image of magic holding ms.
func newImage(t *testing.T, magic uint32, ms ...proto.Message) []byte {
	t.Helper()
	out := binary.LittleEndian.AppendUint32(nil, 0x54564319) // CRIU's image set
	out = binary.LittleEndian.AppendUint32(out, magic)
	for _, m := range ms {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

// fileOwner is the owner of a file no task signals.
func fileOwner() *fown.FownEntry {
	zero := proto.Uint32(0)
	return &fown.FownEntry{Uid: zero, Euid: zero, Signum: zero, PidType: zero, Pid: zero}
}

// tgz is a gzipped tar of the headers hs, with no file data.
func tgz(t *testing.T, hs ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	for _, h := range hs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// hostKey is d's signing key, read from its state directory: what a host
// that forges its own parks signs them with.
func hostKey(t *testing.T, d *daemon) ed25519.PrivateKey {
	t.Helper()
	seed, err := os.ReadFile(filepath.Join(d.state, "host.key"))
	if err != nil {
		t.Fatal(err)
	}
	return ed25519.NewKeyFromSeed(seed)
}
