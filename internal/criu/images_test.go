package criu

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	ghostfile "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/seccomp"
	skopts "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-opts"
	skunix "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// oracle copies the real images (testdata/oracle) into a new directory.
func oracle(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	des, err := os.ReadDir("testdata/oracle")
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join("testdata/oracle", de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, de.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// image is an image's bytes: CRIU's magics, then each message framed by
// its u32 little-endian length.
func image(magic uint32, ms ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, imgCommon)
	b = binary.LittleEndian.AppendUint32(b, magic)
	for _, m := range ms {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	return b
}

// rewrite changes the one message of image name in dir (a core, ids, fs
// or mm image) with change, and writes it back as CRIU would.
func rewrite[M proto.Message](t *testing.T, dir, name string, m M, change func(M)) {
	t.Helper()
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	k, _, _ := kindOf(name)
	es, err := frames(b, k.magic)
	if err != nil || len(es) != 1 {
		t.Fatalf("%s: %d entries, %v", name, len(es), err)
	}
	if err := proto.Unmarshal(es[0], m); err != nil {
		t.Fatal(err)
	}
	change(m)
	out, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, image(k.magic, out), 0o600); err != nil {
		t.Fatal(err)
	}
}

// rewriteEach changes every message of image name in dir.
func rewriteEach[M proto.Message](t *testing.T, dir, name string, fresh func() M, change func(M)) {
	t.Helper()
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	k, _, _ := kindOf(name)
	es, err := frames(b, k.magic)
	if err != nil {
		t.Fatal(err)
	}
	var outs [][]byte
	for _, e := range es {
		m := fresh()
		if err := proto.Unmarshal(e, m); err != nil {
			t.Fatal(err)
		}
		change(m)
		out, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	if err := os.WriteFile(p, image(k.magic, outs...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// creds changes core-TID.img's credentials.
func creds(tid string, change func(*criucore.CoreEntry)) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		rewrite(t, dir, "core-"+tid+".img", &criucore.CoreEntry{}, change)
	}
}

// unknownCreds replaces the creds fields go-criu lacks (no_new_privs,
// cap_amb) with nnp and amb.
func unknownCreds(c *criucore.CoreEntry, nnp uint64, amb ...uint64) {
	cr := c.ThreadCore.Creds
	var b []byte
	b = protowire.AppendTag(b, 18, protowire.VarintType)
	b = protowire.AppendVarint(b, nnp)
	for _, a := range amb {
		b = protowire.AppendTag(b, 19, protowire.VarintType)
		b = protowire.AppendVarint(b, a)
	}
	cr.ProtoReflect().SetUnknown(b)
}

// TestJudgeRefuses rewrites one field of the oracle's images at a time,
// as a signer that means harm would: each is refused, naming the task,
// the image and the field.
func TestJudgeRefuses(t *testing.T) {
	full := []uint32{0xffffffff, 0x1ff}
	for _, c := range []struct {
		name   string
		change func(*testing.T, string)
		task   uint32
		field  string
		policy func(*Policy)
	}{
		{"CapEff", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapEff = full }), 1, "creds.cap_eff", nil},
		{"CapPrm", creds("12", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapPrm = full }), 12, "creds.cap_prm", nil},
		{"CapInh", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapInh = []uint32{1 << 21, 0} }), 1, "creds.cap_inh", nil},
		{"CapBnd", creds("7", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapBnd = full }), 1, "creds.cap_bnd", nil},
		{"CapBndPast64", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.CapBnd = []uint32{0, 0, 1} }), 1, "creds.cap_bnd", nil},
		{"CapAmb", creds("1", func(c *criucore.CoreEntry) { unknownCreds(c, 1, 1<<21, 0) }), 1, "creds.cap_amb", nil},
		{"NoNewPrivsOff", creds("12", func(c *criucore.CoreEntry) { unknownCreds(c, 0, 0, 0) }), 12, "creds.no_new_privs", nil},
		{"NoNewPrivsAbsent", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.ProtoReflect().SetUnknown(nil) }), 1, "creds.no_new_privs", nil},
		{"Securebits", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Secbits = proto.Uint32(0x2f) }), 1, "creds.secbits", nil},
		{"Uid", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Uid = proto.Uint32(1000) }), 1, "creds.uid", nil},
		{"Euid", creds("8", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Euid = proto.Uint32(65534) }), 1, "creds.euid", nil},
		{"Fsgid", creds("12", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Fsgid = proto.Uint32(5) }), 12, "creds.fsgid", nil},
		{"Groups", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.Groups = []uint32{0, 6} }), 1, "creds.groups", nil},
		{"LSMProfile", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.Creds.LsmProfile = proto.String("unconfined") }), 1, "creds.lsm_profile", nil},
		{"SeccompOff", creds("1", func(c *criucore.CoreEntry) { c.ThreadCore.SeccompMode = nil }), 1, "thread_core.seccomp_mode", nil},
		{"SeccompOffChild", creds("12", func(c *criucore.CoreEntry) {
			c.ThreadCore.SeccompMode = criucore.SeccompMode_disabled.Enum()
		}), 12, "thread_core.seccomp_mode", nil},
		{"SeccompOffThread", func(t *testing.T, dir string) {
			noTsync(t, dir)
			rewrite(t, dir, "core-7.img", &criucore.CoreEntry{}, func(c *criucore.CoreEntry) {
				c.ThreadCore.SeccompMode = criucore.SeccompMode_disabled.Enum()
			})
		}, 1, "thread_core.seccomp_mode", nil},
		{"SeccompStrict", creds("12", func(c *criucore.CoreEntry) {
			c.ThreadCore.SeccompMode = criucore.SeccompMode_strict.Enum()
		}), 12, "thread_core.seccomp_mode", nil},
		{"SeccompOldMode", creds("1", func(c *criucore.CoreEntry) {
			c.Tc.OldSeccompMode = criucore.SeccompMode_disabled.Enum()
		}), 1, "tc.old_seccomp_mode", nil},
		{"SeccompFlags", seccompImage(func(e *seccomp.SeccompEntry) { e.SeccompFilters[0].Flags = proto.Uint32(4) }), 1, "seccomp_filters.flags", nil},
		{"SeccompCycle", seccompImage(func(e *seccomp.SeccompEntry) { e.SeccompFilters[0].Prev = proto.Uint32(0) }), 1, "seccomp_filters.prev", nil},
		{"SeccompIndex", creds("12", func(c *criucore.CoreEntry) { c.ThreadCore.SeccompFilter = proto.Uint32(2) }), 12, "seccomp_filters", nil},
		{"SeccompFilterLength", seccompImage(func(e *seccomp.SeccompEntry) { e.SeccompFilters[1].Filter = []byte{1, 2, 3} }), 12, "seccomp_filters.filter", nil},
		{"TaskCoreMissing", creds("1", func(c *criucore.CoreEntry) { c.Tc = nil }), 1, "tc", nil},
		{"RlimitGap", creds("12", func(c *criucore.CoreEntry) { c.Tc.Rlimits.Rlimits = c.Tc.Rlimits.Rlimits[:4] }), 12, "tc.rlimits", nil},
		{"RlimitsPast64", creds("1", func(c *criucore.CoreEntry) {
			for range 49 {
				c.Tc.Rlimits.Rlimits = append(c.Tc.Rlimits.Rlimits, c.Tc.Rlimits.Rlimits[0])
			}
		}), 1, "tc.rlimits", nil},
		{"CgroupSetHostRoot", cgroupSet(func(c *cgroup.CgroupEntry) { c.Sets[0].Ctls[3].Path = proto.String("/") }), 0, "sets.ctls.path", nil},
		{"CgroupSetSibling", cgroupSet(func(c *cgroup.CgroupEntry) { c.Sets[0].Ctls[6].Path = proto.String("/runrecordd-e04f9c36/capX") }), 0, "sets.ctls.path", nil},
		{"CgroupSetDotDot", cgroupSet(func(c *cgroup.CgroupEntry) { c.Sets[0].Ctls[7].Path = proto.String("/runrecordd-e04f9c36/cap/../..") }), 0, "sets.ctls.path", nil},
		{"CgroupSetSlashes", cgroupSet(func(c *cgroup.CgroupEntry) { c.Sets[0].Ctls[0].Path = proto.String("/runrecordd-e04f9c36/cap//x") }), 0, "sets.ctls.path", nil},
		{"CgroupTwoRoots", cgroupSet(func(c *cgroup.CgroupEntry) { c.Controllers[2].Dirs[0].DirName = proto.String("system.slice") }), 0, "dir_name", nil},
		{"PidNamespace", func(t *testing.T, dir string) {
			rewrite(t, dir, "ids-12.img", &criucore.TaskKobjIdsEntry{}, func(m *criucore.TaskKobjIdsEntry) { m.PidNsId = proto.Uint32(1) })
		}, 12, "pid_ns_id", nil},
		{"UserNamespace", func(t *testing.T, dir string) {
			rewrite(t, dir, "ids-1.img", &criucore.TaskKobjIdsEntry{}, func(m *criucore.TaskKobjIdsEntry) { m.UserNsId = proto.Uint32(99) })
		}, 1, "user_ns_id", nil},
		{"HostNetwork", func(t *testing.T, dir string) {
			for _, n := range []string{"ids-1.img", "ids-12.img"} {
				rewrite(t, dir, n, &criucore.TaskKobjIdsEntry{}, func(m *criucore.TaskKobjIdsEntry) { m.NetNsId = proto.Uint32(2) })
			}
		}, 1, "net_ns_id", nil},
		{"OwnTimeNamespace", func(t *testing.T, dir string) {
			for _, n := range []string{"ids-1.img", "ids-12.img"} {
				rewrite(t, dir, n, &criucore.TaskKobjIdsEntry{}, func(m *criucore.TaskKobjIdsEntry) { m.TimeNsId = proto.Uint32(14) })
			}
			rewrite(t, dir, "ids-12.img", &criucore.TaskKobjIdsEntry{}, func(m *criucore.TaskKobjIdsEntry) { m.TimeNsId = proto.Uint32(15) })
		}, 12, "time_ns_id", nil},
		{"MountOfTheHostDisk", func(t *testing.T, dir string) {
			rewriteEach(t, dir, "mountpoints-13.img", func() *mnt.MntEntry { return &mnt.MntEntry{} }, func(m *mnt.MntEntry) {
				if m.GetMountpoint() == "/run" {
					m.Mountpoint, m.Fstype, m.Source = proto.String("/host"), proto.Uint32(0), proto.String("/dev/sda1")
				}
			})
		}, 0, "mnt_entry.mountpoint", nil},
		{"SysWritable", func(t *testing.T, dir string) {
			rewriteEach(t, dir, "mountpoints-13.img", func() *mnt.MntEntry { return &mnt.MntEntry{} }, func(m *mnt.MntEntry) {
				if m.GetMountpoint() == "/sys" {
					m.Flags, m.SbFlags = proto.Uint32(m.GetFlags()&^msRdonly), proto.Uint32(0)
				}
			})
		}, 0, "mnt_entry.flags", nil},
		{"TmpfsBecomesBind", func(t *testing.T, dir string) {
			rewriteEach(t, dir, "mountpoints-13.img", func() *mnt.MntEntry { return &mnt.MntEntry{} }, func(m *mnt.MntEntry) {
				if m.GetMountpoint() == "/run" {
					m.ExtKey = proto.String("/run")
				}
			})
		}, 0, "mnt_entry.root", nil},
		{"ProcSysFromElsewhere", func(t *testing.T, dir string) {
			rewriteEach(t, dir, "mountpoints-13.img", func() *mnt.MntEntry { return &mnt.MntEntry{} }, func(m *mnt.MntEntry) {
				if m.GetMountpoint() == "/proc/sys" {
					m.Root = proto.String("/")
				}
			})
		}, 0, "mnt_entry.root", nil},
		{"FileByRelativePath", files(func(f *fdinfo.FileEntry) {
			if f.GetReg().GetName() == "/tmp/oracle.dat" {
				f.Reg.Name = proto.String("../../../etc/shadow")
			}
		}), 0, "reg.name", nil},
		{"FileOfAKindNoSandboxOpens", files(func(f *fdinfo.FileEntry) {
			if f.GetId() == 7 {
				f.Type, f.Efd = fdinfo.FdTypes_TUNF.Enum(), nil
			}
		}), 0, "type", nil},
		{"UnixSocketToTheHost", func(t *testing.T, dir string) {
			addFile(t, dir, &fdinfo.FileEntry{Type: fdinfo.FdTypes_UNIXSK.Enum(), Id: proto.Uint32(100), Usk: unixSocket(100, 5000, 4000, "")})
		}, 0, "usk.peer", nil},
		{"UnixSocketByRelativeName", func(t *testing.T, dir string) {
			addFile(t, dir, &fdinfo.FileEntry{Type: fdinfo.FdTypes_UNIXSK.Enum(), Id: proto.Uint32(100), Usk: unixSocket(100, 5000, 0, "../run/containerd.sock")})
		}, 0, "name", nil},
		{"CwdNotAFile", func(t *testing.T, dir string) {
			rewrite(t, dir, "fs-12.img", &fs.FsEntry{}, func(m *fs.FsEntry) { m.CwdId = proto.Uint32(999) })
		}, 12, "cwd_id", nil},
		{"UnknownImage", func(t *testing.T, dir string) { write(t, dir, "evil.img", []byte("x")) }, 0, "", nil},
		{"ImageNamedNonCanonically", func(t *testing.T, dir string) { rename(t, dir, "core-7.img", "core-07.img") }, 0, "", nil},
		{"UserNamespaceMaps", func(t *testing.T, dir string) { write(t, dir, "userns-7.img", image(0x55474906)) }, 0, "", nil},
		{"NetworkDevice", func(t *testing.T, dir string) { write(t, dir, "netdev-10.img", image(0x57373951)) }, 0, "", nil},
		{"Inotify", func(t *testing.T, dir string) { write(t, dir, "inotify-wd.img", image(0x54562009)) }, 0, "", nil},
		{"Truncated", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, "core-1.img"))
			write(t, dir, "core-1.img", b[:len(b)-1])
		}, 0, "", nil},
		{"WrongMagic", func(t *testing.T, dir string) { write(t, dir, "fs-1.img", image(0x57492820, []byte{8, 1, 16, 2})) }, 0, "", nil},
		{"CoreOfNoTask", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, "core-7.img"))
			write(t, dir, "core-99.img", b)
		}, 99, "", nil},
		{"DeviceWithoutMknod", func(t *testing.T, dir string) {
			write(t, dir, "tmpfs-dev-45.tar.gz.img", tgz(t, &tar.Header{Name: "./sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o666}))
		}, 0, "mode", without(capMknod)},
		{"CharDeviceNotTheSandboxs", func(t *testing.T, dir string) {
			write(t, dir, "tmpfs-dev-45.tar.gz.img", tgz(t, &tar.Header{Name: "./mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}))
		}, 0, "mode", without(capMknod)},
		{"OwnerWithoutChown", func(t *testing.T, dir string) {
			write(t, dir, "tmpfs-dev-45.tar.gz.img", tgz(t, &tar.Header{Name: "./f", Typeflag: tar.TypeReg, Uid: 1000, Mode: 0o644}))
		}, 0, "uid", without(capChown)},
		{"SetgidWithoutFsetid", func(t *testing.T, dir string) {
			write(t, dir, "tmpfs-dev-45.tar.gz.img", tgz(t, &tar.Header{Name: "./sh", Typeflag: tar.TypeReg, Gid: 5, Mode: 0o2755}))
		}, 0, "mode", without(capFsetid)},
		{"TarThroughItsSymlink", func(t *testing.T, dir string) {
			write(t, dir, "tmpfs-dev-45.tar.gz.img", tgz(t, &tar.Header{Name: "./etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
				&tar.Header{Name: "./etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}))
		}, 0, "name", nil},
		{"TarAbsolute", func(t *testing.T, dir string) {
			write(t, dir, "tmpfs-dev-45.tar.gz.img", tgz(t, &tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}))
		}, 0, "name", nil},
		{"TarHardLinkOut", func(t *testing.T, dir string) {
			write(t, dir, "tmpfs-dev-45.tar.gz.img", tgz(t, &tar.Header{Name: "./shadow", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow"}))
		}, 0, "linkname", nil},
		{"GhostDeviceWithoutMknod", func(t *testing.T, dir string) {
			g, err := proto.Marshal(&ghostfile.GhostFileEntry{Uid: proto.Uint32(0), Gid: proto.Uint32(0), Mode: proto.Uint32(0o060660), Rdev: proto.Uint32(8 << 8)})
			if err != nil {
				t.Fatal(err)
			}
			write(t, dir, "ghost-file-1f.img", image(ghostMagic, g))
		}, 0, "mode", without(capMknod)},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := oracle(t)
			c.change(t, dir)
			p := mustPolicy(t)
			if c.policy != nil {
				c.policy(&p)
			}
			err := checkUnder(dir, p)
			var re *RefusedError
			if !errors.Is(err, ErrRefused) || !errors.As(err, &re) || re.Task != c.task || re.Field != c.field {
				t.Fatalf("%v (%+v); want task %d, field %q refused", err, re, c.task, c.field)
			}
			t.Log(err)
		})
	}
}

// seccompImage changes the oracle's seccomp.img.
func seccompImage(change func(*seccomp.SeccompEntry)) func(*testing.T, string) {
	return func(t *testing.T, dir string) { rewrite(t, dir, "seccomp.img", &seccomp.SeccompEntry{}, change) }
}

// noTsync takes TSYNC off the oracle's filters: its threads then have
// filters of their own, and none.
func noTsync(t *testing.T, dir string) {
	seccompImage(func(e *seccomp.SeccompEntry) {
		for _, f := range e.SeccompFilters {
			f.Flags = proto.Uint32(f.GetFlags() &^ seccompTsync)
		}
	})(t, dir)
}

// oomScoreAdj is a policy change: the spec sets oom_score_adj v.
func oomScoreAdj(v int) func(*Policy) {
	return func(p *Policy) { p.OOMScoreAdj = &v }
}

// files changes each entry of files.img.
func files(change func(*fdinfo.FileEntry)) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		rewriteEach(t, dir, "files.img", func() *fdinfo.FileEntry { return &fdinfo.FileEntry{} }, change)
	}
}

// addFile appends f to files.img.
func addFile(t *testing.T, dir string, f *fdinfo.FileEntry) {
	t.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "files.img")
	old, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "files.img", append(old, image(0, b)[8:]...))
}

func unixSocket(id, ino, peer uint32, name string) *skunix.UnixSkEntry {
	zero := proto.Uint32(0)
	return &skunix.UnixSkEntry{Id: proto.Uint32(id), Ino: proto.Uint32(ino), Type: proto.Uint32(1), State: proto.Uint32(1),
		Flags: zero, Uflags: zero, Backlog: zero, Peer: proto.Uint32(peer),
		Fown: &fown.FownEntry{Uid: zero, Euid: zero, Signum: zero, PidType: zero, Pid: zero},
		Opts: &skopts.SkOptsEntry{SoSndbuf: zero, SoRcvbuf: zero, SoSndTmoSec: proto.Uint64(0), SoSndTmoUsec: proto.Uint64(0),
			SoRcvTmoSec: proto.Uint64(0), SoRcvTmoUsec: proto.Uint64(0)},
		Name: []byte(name)}
}

// check reads and judges dir under the sandbox's policy.
func check(t testing.TB, dir string) error { return checkUnder(dir, mustPolicy(t)) }

func checkUnder(dir string, p Policy) error {
	im, err := Read(dir)
	if err != nil {
		return err
	}
	return im.Judge(p)
}

// without is a policy change: capability c not granted.
func without(c uint) func(*Policy) {
	return func(p *Policy) { p.Effective &^= 1 << c }
}

func write(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func rename(t *testing.T, dir, from, to string) {
	t.Helper()
	if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		t.Fatal(err)
	}
}

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

// TestKindOf: an image is of a kind only under the name CRIU gives it.
func TestKindOf(t *testing.T) {
	for name, want := range map[string]string{
		"core-7.img": "core-", "core-07.img": "", "tmpfs-dev-45.tar.gz.img": "tmpfs-dev-", "tmpfs-4.tar.gz.img": "tmpfs-",
		"ghost-file-1f.img": "ghost-file-", "ghost-file-1F.img": "", "pagemap-shmem-3.img": "pagemap-shmem-",
		"pagemap-3.img": "pagemap-", "pages-1.img": "pages-", "inventory.img": "inventory", "inventory": "",
		"core-4294967296.img": "", "descriptors.json": "descriptors", "../core-1.img": "",
	} {
		k, _, ok := kindOf(name)
		if got := ""; ok {
			got = k.prefix
			if got != want {
				t.Errorf("%s: kind %q, want %q", name, got, want)
			}
		} else if want != "" {
			t.Errorf("%s: no kind, want %q", name, want)
		}
	}
	if !strings.HasPrefix(kinds[0].prefix, "inventory") {
		t.Fatal("the table starts with the inventory")
	}
}

// TestTrustDocTable: docs/trust.md has a row for every kind of image,
// with its verdict.
func TestTrustDocTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/trust.md")
	if err != nil {
		t.Fatal(err)
	}
	v := map[verdict]string{refused: "refused", harmless: "harmless", checked: "checked", unread: "not read"}
	for _, k := range kinds {
		row := "| `" + docName(k) + "` | " + v[k.verdict] + " | " + k.why + " |"
		if !strings.Contains(string(b), row) {
			t.Errorf("docs/trust.md lacks the row %s", row)
		}
	}
}

// cgroupSet changes the oracle's cgroup.img.
func cgroupSet(change func(*cgroup.CgroupEntry)) func(*testing.T, string) {
	return func(t *testing.T, dir string) { rewrite(t, dir, "cgroup.img", &cgroup.CgroupEntry{}, change) }
}

// An image whose entries are each followed by data (a pipe's queued bytes,
// a socket's queued packet) is split at its entries, the data passed
// over; one whose data outruns the file is refused. A TCP connection's
// and a shared memory segment's data follow their one entry to the end.
func TestFramesWithData(t *testing.T) {
	entry := func(field2 uint64) []byte {
		e := protowire.AppendTag(nil, 1, protowire.VarintType)
		e = protowire.AppendVarint(e, 7)
		e = protowire.AppendTag(e, 2, protowire.VarintType)
		return protowire.AppendVarint(e, field2)
	}
	framed := func(magic uint32, parts ...[]byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, imgCommon)
		b = binary.LittleEndian.AppendUint32(b, magic)
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	withLen := func(e []byte) []byte { return append(binary.LittleEndian.AppendUint32(nil, uint32(len(e))), e...) }
	for _, name := range []string{"pipes-data.img", "fifo-data.img", "sk-queues.img"} {
		k, _, _ := kindOf(name)
		b := framed(k.magic, withLen(entry(5)), []byte("hello"), withLen(entry(0)), withLen(entry(3)), []byte{0xff, 0xff, 0xff})
		es, err := frames(b, k.magic)
		if err != nil || len(es) != 3 {
			t.Errorf("%s: %d entries, %v; want 3", name, len(es), err)
		}
		if _, err := frames(framed(k.magic, withLen(entry(6)), []byte("hello")), k.magic); err == nil {
			t.Errorf("%s: data past the file's end taken", name)
		}
	}
	for _, name := range []string{"tcp-stream-3f.img", "ipcns-shm-9.img"} {
		k, _, _ := kindOf(name)
		es, err := frames(framed(k.magic, withLen(entry(2)), []byte{0xff, 0xff, 0xff, 0xff, 1}), k.magic)
		if err != nil || len(es) != 1 {
			t.Errorf("%s: %d entries, %v; want 1", name, len(es), err)
		}
	}
}
