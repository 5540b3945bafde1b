package criu

import (
	"archive/tar"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	ghostfile "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	skunix "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-unix"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

// Policy is what a restore here may grant a unit: what this host itself
// gives the sandbox it restores into (PolicyOf its OCI spec).
type Policy struct {
	// Effective, Permitted, Inheritable, Bounding and Ambient are the
	// capability sets, as bit masks (bit n: capability n).
	Effective, Permitted, Inheritable, Bounding, Ambient uint64
	// Securebits is the securebits runc leaves a unit with.
	Securebits uint32
	// UIDs and GIDs are the ids a task may hold (real, effective,
	// saved, filesystem; GIDs the supplementary groups too). Today the
	// ids the spec's process runs as; in a user namespace, every id the
	// namespace maps (in-namespace ids: the images hold no others).
	UIDs, GIDs IDRange
	// UIDMap and GIDMap are the user namespace's maps (one extent from
	// 0 to the run's host range), when the sandbox has one.
	UIDMap, GIDMap specs.LinuxIDMapping
	// NoNewPrivs is whether every task must have no_new_privs set.
	NoNewPrivs bool
	// Seccomp is whether every task must be in seccomp filter mode.
	Seccomp bool
	// Namespaces are the kinds of namespace the sandbox has of its own
	// (pid, network, ipc, uts, mount, user, cgroup, time); of the
	// others, it shares the host's.
	Namespaces map[specs.LinuxNamespaceType]bool
	// Mounts are the mounts the sandbox has, by mount point.
	Mounts map[string]Mount
	// Rlimits are the limits the spec sets, by resource number
	// (RLIMIT_NOFILE: 7): a restore lowers a task's soft and hard limits
	// to the spec's hard one, and sets one the images lack to the
	// spec's ([Images.Narrow]). The others are the runtime's, which the
	// spec does not say.
	Rlimits map[int]Rlimit
	// OOMScoreAdj is the spec's oom_score_adj, when it sets one: a
	// restore raises a task's lower one to it.
	OOMScoreAdj *int
	// Devices are the device nodes (major<<32|minor, character devices)
	// a tmpfs of the sandbox may hold.
	Devices map[uint64]bool
}

// Rlimit is a resource limit: soft and hard, RLIM_INFINITY ^uint64(0).
type Rlimit struct {
	Soft, Hard uint64
}

// IDRange is a set of uids and gids: IDs Lo up to Hi, both included, and
// the ids in Also.
type IDRange struct {
	Lo, Hi uint32
	Also   []uint32
}

// Has says whether id is in r.
func (r IDRange) Has(id uint32) bool {
	return (id >= r.Lo && id <= r.Hi) || slices.Contains(r.Also, id)
}

// Mount is a mount the spec makes: its filesystem type (an OCI mount's
// type: "bind", "proc", "tmpfs"…) and the flags it must have.
type Mount struct {
	Type                       string
	ReadOnly, NoSuid, NoDev    bool
	NoExec                     bool
	External                   bool // a bind mount of a host path: runc maps it at each restore
	Masked, ReadOnlyPath, Root bool
}

// mount(2) flags as mountinfo reports them (linux/mount.h).
const (
	msRdonly = 1
	msNosuid = 2
	msNodev  = 4
	msNoexec = 8
)

// PolicyOf is the policy of a sandbox run under the OCI spec s, the one
// its restore is given: the capabilities, user, no_new_privs, seccomp,
// namespaces and mounts runc applies to a unit it starts.
func PolicyOf(s *specs.Spec) (Policy, error) {
	p := Policy{Namespaces: map[specs.LinuxNamespaceType]bool{}, Mounts: map[string]Mount{}, Devices: map[uint64]bool{}, Rlimits: map[int]Rlimit{}}
	if s.Process == nil || s.Linux == nil || s.Root == nil {
		return p, fmt.Errorf("criu: an OCI spec without a process, root or linux section")
	}
	if c := s.Process.Capabilities; c != nil {
		var err error
		for _, set := range []struct {
			dst   *uint64
			names []string
		}{{&p.Effective, c.Effective}, {&p.Permitted, c.Permitted}, {&p.Inheritable, c.Inheritable},
			{&p.Bounding, c.Bounding}, {&p.Ambient, c.Ambient}} {
			if *set.dst, err = capMask(set.names); err != nil {
				return p, err
			}
		}
	}
	u := s.Process.User
	p.UIDs = IDRange{Lo: u.UID, Hi: u.UID}
	p.GIDs = IDRange{Lo: u.GID, Hi: u.GID, Also: u.AdditionalGids}
	for _, r := range s.Process.Rlimits {
		n := slices.Index(strings.Fields(rlimitNames), strings.TrimPrefix(r.Type, "RLIMIT_"))
		if n < 0 {
			return p, fmt.Errorf("criu: an OCI spec with the unknown rlimit %q", r.Type)
		}
		p.Rlimits[n] = Rlimit{Soft: r.Soft, Hard: r.Hard}
	}
	p.NoNewPrivs = s.Process.NoNewPrivileges
	if v := s.Process.OOMScoreAdj; v != nil {
		adj := *v
		p.OOMScoreAdj = &adj
	}
	p.Seccomp = s.Linux.Seccomp != nil
	for _, n := range s.Linux.Namespaces {
		p.Namespaces[n.Type] = true
	}
	if p.Namespaces[specs.UserNamespace] {
		var err error
		if p.UIDMap, err = idMapOf("uid", s.Linux.UIDMappings); err != nil {
			return p, err
		}
		if p.GIDMap, err = idMapOf("gid", s.Linux.GIDMappings); err != nil {
			return p, err
		}
		p.UIDs = IDRange{Lo: 0, Hi: p.UIDMap.Size - 1}
		p.GIDs = IDRange{Lo: 0, Hi: p.GIDMap.Size - 1}
	}
	p.Mounts["/"] = Mount{Type: "rootfs", ReadOnly: s.Root.Readonly, Root: true}
	for _, m := range s.Mounts {
		mt := Mount{Type: m.Type}
		for _, o := range m.Options {
			switch o {
			case "ro":
				mt.ReadOnly = true
			case "nosuid":
				mt.NoSuid = true
			case "nodev":
				mt.NoDev = true
			case "noexec":
				mt.NoExec = true
			case "bind", "rbind":
				mt.Type = "bind"
			}
		}
		mt.External = mt.Type == "bind"
		p.Mounts[path.Clean(m.Destination)] = mt
	}
	for _, m := range s.Linux.MaskedPaths {
		p.Mounts[path.Clean(m)] = Mount{Type: "masked", Masked: true}
	}
	for _, m := range s.Linux.ReadonlyPaths {
		p.Mounts[path.Clean(m)] = Mount{Type: "readonly", ReadOnly: true, NoSuid: true, NoDev: true, NoExec: true, ReadOnlyPath: true}
	}
	for _, d := range s.Linux.Devices {
		if d.Type == "c" {
			p.Devices[uint64(d.Major)<<32|uint64(d.Minor)] = true
		}
		if p.Namespaces[specs.UserNamespace] {
			p.Mounts[path.Clean(d.Path)] = Mount{Type: "bind", External: true}
		}
	}
	if p.Namespaces[specs.UserNamespace] {
		// In a user namespace runc cannot make device nodes: it binds
		// the host's, its default devices' and the spec's, each an
		// external mount keyed by its place.
		for _, d := range []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom"} {
			p.Mounts[d] = Mount{Type: "bind", External: true}
		}
	}
	// runc makes these in every container's /dev (libcontainer's
	// default devices), whatever the spec lists.
	for _, d := range [][2]uint64{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}} {
		p.Devices[d[0]<<32|d[1]] = true
	}
	return p, nil
}

// capMask is the bit mask of the capabilities named ("CAP_CHOWN"…).
func capMask(names []string) (uint64, error) {
	var m uint64
	for _, n := range names {
		c, ok := capByName[strings.ToUpper(n)]
		if !ok {
			return 0, fmt.Errorf("criu: an OCI spec with the unknown capability %q", n)
		}
		m |= 1 << c
	}
	return m, nil
}

// capByName is every capability linux/capability.h names, by its OCI
// name, as its number.
var capByName = func() map[string]int {
	out := map[string]int{}
	for i, n := range strings.Fields(capNames) {
		out["CAP_"+n] = i
	}
	return out
}()

// rlimitNames are the resource limits in the order of their numbers
// (asm-generic/resource.h).
const rlimitNames = `CPU FSIZE DATA STACK CORE RSS NPROC NOFILE MEMLOCK AS LOCKS SIGPENDING
MSGQUEUE NICE RTPRIO RTTIME`

// capSysResource lets a task raise a hard limit.
const capSysResource = 24

// capNames are the capabilities in the order of their numbers.
const capNames = `CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID
SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN
NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE
SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME
SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ
PERFMON BPF CHECKPOINT_RESTORE`

// Judge refuses images that grant more than p: it returns a
// [*RefusedError] naming the task and the field, or nil. Limits and
// oom_score_adj beyond p it passes, where [Images.Narrow] brings them
// within p, and seccomp filters other than the spec's, which
// [Images.Stack] covers: a restore runs both on what Judge passes.
func (im *Images) Judge(p Policy) error {
	if im.Inventory == nil {
		return refuse(0, "inventory.img", "", "missing")
	}
	if len(im.Tasks) == 0 {
		return refuse(0, "pstree.img", "", "no task")
	}
	// The files a restore remakes first: each is judged by what the
	// spec's capabilities let the unit make itself.
	for name, g := range im.Ghosts {
		if err := judgeGhost(name, g, p); err != nil {
			return err
		}
	}
	for name, hs := range im.Tmpfs {
		if err := judgeTar(name, hs, p); err != nil {
			return err
		}
	}
	root := im.Tasks[0].GetPid()
	rootIDs, err := im.taskIDs(root)
	if err != nil {
		return err
	}
	if err := im.judgeUserns(root, rootIDs.GetUserNsId(), p); err != nil {
		return err
	}
	if err := judgeNamespaces(root, rootIDs, im.Inventory.GetRootIds(), p); err != nil {
		return err
	}
	seen := map[uint32]bool{}
	for _, t := range im.Tasks {
		pid := t.GetPid()
		if seen[pid] {
			return refuse(pid, "pstree.img", "pid", "listed twice")
		}
		seen[pid] = true
		ids, err := im.taskIDs(pid)
		if err != nil {
			return err
		}
		if err := sameNamespaces(pid, ids, rootIDs); err != nil {
			return err
		}
		if !slices.Contains(t.GetThreads(), pid) {
			return refuse(pid, "pstree.img", "threads", "the task is not among its threads")
		}
		for _, tid := range t.GetThreads() {
			if tid != pid && seen[tid] {
				return refuse(pid, "pstree.img", "threads", "thread %d listed twice", tid)
			}
			seen[tid] = true
			if err := im.judgeThread(pid, tid, p); err != nil {
				return err
			}
		}
	}
	for _, name := range im.Names {
		k, n, _ := kindOf(name)
		if k.prefix == "core-" && !seen[uint32(n)] {
			return refuse(uint32(n), name, "", "a core image of no task or thread in pstree.img")
		}
	}
	files, err := im.judgeFiles(p)
	if err != nil {
		return err
	}
	for pid, m := range im.MMs {
		if id := m.GetExeFileId(); id != 0 && !files[id] {
			return refuse(pid, fmt.Sprintf("mm-%d.img", pid), "exe_file_id", "file %d is not a file of the images", id)
		}
	}
	for pid, f := range im.FSs {
		for _, x := range []struct {
			field string
			id    uint32
		}{{"cwd_id", f.GetCwdId()}, {"root_id", f.GetRootId()}} {
			if !files[x.id] {
				return refuse(pid, fmt.Sprintf("fs-%d.img", pid), x.field, "file %d is not a file of the images", x.id)
			}
		}
	}
	for nsid, ms := range im.Mounts {
		if nsid != rootIDs.GetMntNsId() {
			return refuse(0, fmt.Sprintf("mountpoints-%d.img", nsid), "", "the mounts of a mount namespace no task is in")
		}
		if err := judgeMounts(fmt.Sprintf("mountpoints-%d.img", nsid), ms, p); err != nil {
			return err
		}
	}
	for _, c := range im.Cgroups {
		if err := judgeCgroups(c); err != nil {
			return err
		}
	}
	if len(im.Descriptors) > 3 {
		return refuse(0, "descriptors.json", "", "%d descriptors, runc reconnects stdin, stdout and stderr", len(im.Descriptors))
	}
	return nil
}

// taskIDs is task pid's namespace ids (ids-PID.img, or its core's).
func (im *Images) taskIDs(pid uint32) (*criucore.TaskKobjIdsEntry, error) {
	if ids := im.IDs[pid]; ids != nil {
		return ids, nil
	}
	if c := im.Cores[pid]; c != nil && c.Ids != nil {
		return c.Ids, nil
	}
	return nil, refuse(pid, fmt.Sprintf("ids-%d.img", pid), "", "missing")
}

// judgeNamespaces refuses a root task whose namespaces are not the
// sandbox's: of each kind the spec gives it, its own (not CRIU's, which
// the inventory's root_ids are); of each other kind, the host's.
func judgeNamespaces(pid uint32, ids, host *criucore.TaskKobjIdsEntry, p Policy) error {
	for _, n := range nsFields(ids, host) {
		own := n.id != n.host
		if n.id == 0 {
			continue // a kind CRIU did not record: no namespace restored
		}
		if n.kind == specs.TimeNamespace {
			// CRIU restores every unit into a time namespace of its
			// own (timens-0.img: clock offsets only it sees), so a
			// unit parked after a resume has one.
			continue
		}
		if want := p.Namespaces[n.kind]; own != want {
			what := "its own"
			if !want {
				what = "the host's"
			}
			return refuse(pid, fmt.Sprintf("ids-%d.img", pid), n.field, "namespace %d: the sandbox's %s namespace is %s", n.id, n.kind, what)
		}
	}
	return nil
}

// sameNamespaces refuses a task not in every namespace of the root task.
func sameNamespaces(pid uint32, ids, root *criucore.TaskKobjIdsEntry) error {
	for _, n := range nsFields(ids, root) {
		if n.id != n.host {
			return refuse(pid, fmt.Sprintf("ids-%d.img", pid), n.field, "namespace %d, the root task's is %d", n.id, n.host)
		}
	}
	return nil
}

type nsField struct {
	field    string
	kind     specs.LinuxNamespaceType
	id, host uint32
}

func nsFields(a, b *criucore.TaskKobjIdsEntry) []nsField {
	return []nsField{
		{"pid_ns_id", specs.PIDNamespace, a.GetPidNsId(), b.GetPidNsId()},
		{"net_ns_id", specs.NetworkNamespace, a.GetNetNsId(), b.GetNetNsId()},
		{"ipc_ns_id", specs.IPCNamespace, a.GetIpcNsId(), b.GetIpcNsId()},
		{"uts_ns_id", specs.UTSNamespace, a.GetUtsNsId(), b.GetUtsNsId()},
		{"mnt_ns_id", specs.MountNamespace, a.GetMntNsId(), b.GetMntNsId()},
		{"user_ns_id", specs.UserNamespace, a.GetUserNsId(), b.GetUserNsId()},
		{"cgroup_ns_id", specs.CgroupNamespace, a.GetCgroupNsId(), b.GetCgroupNsId()},
		{"time_ns_id", specs.TimeNamespace, a.GetTimeNsId(), b.GetTimeNsId()},
	}
}

// judgeThread refuses a thread of task pid whose credentials, securebits,
// no_new_privs or seccomp mode are not what p gives.
func (im *Images) judgeThread(pid, tid uint32, p Policy) error {
	name := fmt.Sprintf("core-%d.img", tid)
	c := im.Cores[tid]
	if c == nil {
		return refuse(pid, name, "", "missing")
	}
	tc := c.GetThreadCore()
	cr := tc.GetCreds()
	if cr == nil {
		return refuse(pid, name, "thread_core.creds", "missing")
	}
	for _, set := range []struct {
		field string
		words []uint32
		max   uint64
	}{{"creds.cap_eff", cr.GetCapEff(), p.Effective}, {"creds.cap_prm", cr.GetCapPrm(), p.Permitted},
		{"creds.cap_inh", cr.GetCapInh(), p.Inheritable}, {"creds.cap_bnd", cr.GetCapBnd(), p.Bounding},
		{"creds.cap_amb", im.CapAmb[tid], p.Ambient}} {
		if len(set.words) > 2 {
			for _, w := range set.words[2:] {
				if w != 0 {
					return refuse(pid, name, set.field, "capabilities past 64")
				}
			}
		}
		var m uint64
		for i, w := range set.words[:min(2, len(set.words))] {
			m |= uint64(w) << (32 * i)
		}
		if extra := m &^ set.max; extra != 0 {
			return refuse(pid, name, set.field, "%#x holds %#x beyond the spec's %#x", m, extra, set.max)
		}
	}
	if cr.GetSecbits() != p.Securebits {
		return refuse(pid, name, "creds.secbits", "%#x, the sandbox's are %#x", cr.GetSecbits(), p.Securebits)
	}
	for _, id := range []struct {
		field string
		v     uint32
	}{{"creds.uid", cr.GetUid()}, {"creds.euid", cr.GetEuid()}, {"creds.suid", cr.GetSuid()}, {"creds.fsuid", cr.GetFsuid()}} {
		if !p.UIDs.Has(id.v) {
			return refuse(pid, name, id.field, "%d is outside the run's ids", id.v)
		}
	}
	for _, id := range []struct {
		field string
		v     uint32
	}{{"creds.gid", cr.GetGid()}, {"creds.egid", cr.GetEgid()}, {"creds.sgid", cr.GetSgid()}, {"creds.fsgid", cr.GetFsgid()}} {
		if !p.GIDs.Has(id.v) {
			return refuse(pid, name, id.field, "%d is outside the run's ids", id.v)
		}
	}
	if len(cr.GetGroups()) > 65536 {
		return refuse(pid, name, "creds.groups", "%d groups", len(cr.GetGroups()))
	}
	for _, g := range cr.GetGroups() {
		if !p.GIDs.Has(g) {
			return refuse(pid, name, "creds.groups", "%d is outside the run's ids", g)
		}
	}
	if p.NoNewPrivs {
		if n := im.NoNewPrivs[tid]; n == nil || *n == 0 {
			return refuse(pid, name, "creds.no_new_privs", "off, the sandbox sets it")
		}
	}
	if lsm := cr.GetLsmProfile(); lsm != "" || cr.GetLsmSockcreate() != "" || len(cr.GetApparmorData()) > 0 {
		return refuse(pid, name, "creds.lsm_profile", "an LSM profile (%q): the sandbox names none", lsm)
	}
	// Seccomp: every thread in filter mode, or sharing its leader's
	// filters (seccompChain).
	if p.Seccomp {
		if _, _, err := im.seccompChain(pid, tid); err != nil {
			return err
		}
	}
	if tid == pid {
		return judgeTask(pid, name, c, p)
	}
	return nil
}

// judgeTask refuses a task (its leader's core, name) whose limits or
// oom_score_adj p sets and [Images.Narrow] cannot bring within p: see
// narrowTask.
func judgeTask(pid uint32, name string, c *criucore.CoreEntry, p Policy) error {
	_, err := narrowTask(pid, name, proto.Clone(c).(*criucore.CoreEntry), p)
	return err
}

// judgeFiles refuses open files of a kind no sandbox here grants, and
// paths and unix socket names outside the sandbox: it returns the ids of
// the files.
func (im *Images) judgeFiles(p Policy) (map[uint32]bool, error) {
	ids := map[uint32]bool{}
	for _, f := range im.Files {
		id := f.GetId()
		if ids[id] {
			return nil, refuse(0, "files.img", "id", "file %d listed twice", id)
		}
		ids[id] = true
		switch f.GetType() {
		case fdinfo.FdTypes_REG:
			r := f.GetReg()
			if r == nil {
				return nil, refuse(0, "files.img", "reg", "file %d: a regular file without its entry", id)
			}
			if err := judgePath("files.img", "reg.name", r.GetName()); err != nil {
				return nil, err
			}
		case fdinfo.FdTypes_UNIXSK:
			u := f.GetUsk()
			if u == nil {
				return nil, refuse(0, "files.img", "usk", "file %d: a unix socket without its entry", id)
			}
			if err := judgeSocket("files.img", u.GetName(), u.GetNameDir()); err != nil {
				return nil, err
			}
		case fdinfo.FdTypes_PIPE, fdinfo.FdTypes_FIFO, fdinfo.FdTypes_INETSK, fdinfo.FdTypes_EVENTFD,
			fdinfo.FdTypes_EVENTPOLL, fdinfo.FdTypes_SIGNALFD, fdinfo.FdTypes_PACKETSK, fdinfo.FdTypes_NETLINKSK,
			fdinfo.FdTypes_TIMERFD, fdinfo.FdTypes_MEMFD, fdPidfd:
		case fdinfo.FdTypes_NS:
			nsf := f.GetNsf()
			if nsf == nil {
				return nil, refuse(0, "files.img", "nsf", "file %d: a namespace file without its entry", id)
			}
			if err := im.judgeNSFile(nsf.GetNsId()); err != nil {
				return nil, err
			}
		default:
			return nil, refuse(0, "files.img", "type", "file %d of type %s: no sandbox here opens one", id, f.GetType())
		}
	}
	for _, r := range im.RegFiles {
		ids[r.GetId()] = true
		if err := judgePath("reg-files.img", "name", r.GetName()); err != nil {
			return nil, err
		}
	}
	for _, u := range im.UnixSks {
		ids[u.GetId()] = true
		if err := judgeSocket("unixsk.img", u.GetName(), u.GetNameDir()); err != nil {
			return nil, err
		}
	}
	for _, n := range im.NSFiles {
		ids[n.GetId()] = true
		if err := im.judgeNSFile(n.GetNsId()); err != nil {
			return nil, err
		}
	}
	if err := im.judgePeers(); err != nil {
		return nil, err
	}
	for files, fds := range im.FDs {
		for _, fd := range fds {
			if !ids[fd.GetId()] {
				return nil, refuse(0, fmt.Sprintf("fdinfo-%d.img", files), "id", "descriptor %d names file %d, which is not in the images", fd.GetFd(), fd.GetId())
			}
		}
	}
	return ids, nil
}

// judgePeers refuses a unix socket connected to a peer that is not one
// of the images' sockets: one outside the sandbox (runc passes CRIU no
// external sockets, so it would refuse it too; this says which).
func (im *Images) judgePeers() error {
	socks := append([]*skunix.UnixSkEntry(nil), im.UnixSks...)
	for _, f := range im.Files {
		if u := f.GetUsk(); u != nil {
			socks = append(socks, u)
		}
	}
	inos := make(map[uint32]bool, len(socks))
	for _, u := range socks {
		inos[u.GetIno()] = true
	}
	for _, u := range socks {
		if p := u.GetPeer(); p != 0 && !inos[p] {
			return refuse(0, "files.img", "usk.peer", "socket %d is connected to %d, which is not the unit's (%q)", u.GetIno(), p, u.GetName())
		}
	}
	return nil
}

// fdPidfd is CRIU 4.2's PIDFD file type, which go-criu's protos lack.
const fdPidfd = fdinfo.FdTypes(20)

// judgeNSFile refuses an open namespace file of a namespace no task is in.
func (im *Images) judgeNSFile(nsid uint32) error {
	for _, t := range im.Tasks {
		ids, err := im.taskIDs(t.GetPid())
		if err != nil {
			return err
		}
		for _, n := range nsFields(ids, ids) {
			if n.id == nsid {
				return nil
			}
		}
	}
	return refuse(0, "ns-files.img", "ns_id", "namespace %d is not one of the unit's", nsid)
}

// judgePath refuses a path that is not absolute and clean: every path in
// an image is resolved in the sandbox's own mount namespace, whose mounts
// are judged, so an absolute clean path is within its root or a mount of
// the spec. A deleted file's path carries CRIU's " (deleted)" suffix.
func judgePath(image, field, p string) error {
	if len(p) > 4096 || !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0) {
		return refuse(0, image, field, "%q is not a clean absolute path in the sandbox", p)
	}
	return nil
}

// judgeSocket refuses a unix socket bound or connected to a path that is
// not within the sandbox; an abstract name (leading NUL) is in the
// sandbox's own network namespace.
func judgeSocket(image string, name []byte, dir string) error {
	if len(name) == 0 || name[0] == 0 {
		return nil
	}
	if dir != "" {
		return refuse(0, image, "name_dir", "%q: a socket name relative to a directory", dir)
	}
	return judgePath(image, "name", string(name))
}

// judgeMounts refuses a mount that is not one the spec makes, at its
// place, of its kind and with its flags.
func judgeMounts(image string, ms []*mnt.MntEntry, p Policy) error {
	byID := map[uint32]*mnt.MntEntry{}
	for _, m := range ms {
		if byID[m.GetMntId()] != nil {
			return refuse(0, image, "mnt_id", "mount %d listed twice", m.GetMntId())
		}
		byID[m.GetMntId()] = m
	}
	roots := 0
	for _, m := range ms {
		mp := m.GetMountpoint()
		field := func(f string) string { return "mnt_entry." + f }
		if !path.IsAbs(mp) || path.Clean(mp) != mp {
			return refuse(0, image, field("mountpoint"), "%q is not a clean absolute path", mp)
		}
		want, ok := p.Mounts[mp]
		if !ok {
			return refuse(0, image, field("mountpoint"), "%q: the spec makes no mount there", mp)
		}
		if m.GetWithPlugin() {
			return refuse(0, image, field("with_plugin"), "%q: a mount a plugin restores", mp)
		}
		flags := m.GetFlags() | m.GetSbFlags()
		for _, f := range []struct {
			on   bool
			bit  uint32
			name string
		}{{want.ReadOnly, msRdonly, "ro"}, {want.NoSuid, msNosuid, "nosuid"}, {want.NoDev, msNodev, "nodev"}, {want.NoExec, msNoexec, "noexec"}} {
			if f.on && flags&f.bit == 0 {
				return refuse(0, image, field("flags"), "%q: not %s, as the spec mounts it", mp, f.name)
			}
		}
		ext := m.GetExtKey() != "" || m.GetExtMount()
		parent := byID[m.GetParentMntId()]
		switch {
		case want.Root:
			roots++
			if parent != nil || ext {
				return refuse(0, image, field("mountpoint"), "the root mount is the sandbox's, made by runc")
			}
		case want.External:
			if m.GetExtKey() != mp {
				return refuse(0, image, field("ext_key"), "%q: a bind mount of the spec's is the host's, keyed by its place; not %q", mp, m.GetExtKey())
			}
		case want.Masked:
			// runc masks a file with /dev/null, a directory with an
			// empty read-only tmpfs.
			if !(m.GetExtKey() == "/dev/null" || (!ext && m.GetFstype() == uint32(mnt.Fstype_TMPFS) && m.GetRoot() == "/" && flags&msRdonly != 0)) {
				return refuse(0, image, field("fstype"), "%q: a masked path is /dev/null or an empty tmpfs", mp)
			}
		case want.ReadOnlyPath:
			// runc binds the path over itself, read-only: a mount of
			// its parent's filesystem at the same place in it.
			if ext || parent == nil || m.GetRootDev() != parent.GetRootDev() || m.GetFstype() != parent.GetFstype() ||
				path.Join(parent.GetRoot(), strings.TrimPrefix(mp, parent.GetMountpoint())) != m.GetRoot() {
				return refuse(0, image, field("root"), "%q: a read-only path is a bind of itself", mp)
			}
		default:
			if ext || m.GetRoot() != "/" {
				return refuse(0, image, field("root"), "%q: a %s mount of the spec's is a new one, not a bind of %q", mp, want.Type, m.GetRoot())
			}
			if ft, ok := fstypes[want.Type]; !ok || m.GetFstype() != uint32(ft) {
				return refuse(0, image, field("fstype"), "%q: fstype %d, the spec mounts %s", mp, m.GetFstype(), want.Type)
			}
		}
	}
	if roots != 1 {
		return refuse(0, image, "mnt_entry.mountpoint", "%d root mounts", roots)
	}
	return nil
}

// fstypes are CRIU's filesystem types (images/mnt.proto) of the OCI
// mount types a spec here uses.
var fstypes = map[string]mnt.Fstype{
	"proc": mnt.Fstype_PROC, "sysfs": mnt.Fstype_SYSFS, "tmpfs": mnt.Fstype_TMPFS, "devpts": mnt.Fstype_DEVPTS,
	"mqueue": mnt.Fstype_MQUEUE, "cgroup": mnt.Fstype_CGROUP, "cgroup2": mnt.Fstype_CGROUP2,
}

// Capabilities whose grant lets a unit make a file of its own that a
// restore remakes (linux/capability.h).
const (
	capChown  = 0
	capFowner = 3
	capFsetid = 4
	capMknod  = 27
)

// has says whether the spec gives the unit capability c.
func (p Policy) has(c uint) bool { return p.Effective&(1<<c) != 0 }

// file is a file a restore remakes in the unit's filesystem: a deleted
// file (ghost) or a tmpfs's member.
type file struct {
	name         string
	kind         byte // 'r' regular, 'd' directory, 'l' symbolic link, 'p' FIFO, 'c' or 'b' device, 'h' hard link
	perm         uint32
	uid, gid     uint32
	major, minor uint32
}

// judgeFile refuses a file the unit could not have made itself under the
// spec: a device node without CAP_MKNOD (but the sandbox's own character
// devices), an owner outside the run's ids without CAP_CHOWN, a set-uid
// bit on another's file without CAP_FOWNER, a set-gid bit for another
// group without CAP_FSETID. (Within the sandbox, the devices cgroup says
// which device a node opens, and no_new_privs that no set-id bit raises
// a task.)
func judgeFile(image string, f file, p Policy) error {
	switch f.kind {
	case 'r', 'd', 'l', 'p', 'h':
	case 'c', 'b':
		if !p.has(capMknod) && (f.kind != 'c' || !p.Devices[uint64(f.major)<<32|uint64(f.minor)]) {
			return refuse(0, image, "mode", "%s: device %d:%d is not one of the sandbox's", f.name, f.major, f.minor)
		}
	default:
		return refuse(0, image, "mode", "%s: not a kind of file a sandbox here makes", f.name)
	}
	switch {
	case !p.has(capChown) && (!p.UIDs.Has(f.uid) || !p.GIDs.Has(f.gid)):
		return refuse(0, image, "uid", "%s: owned by %d:%d, outside the run's ids", f.name, f.uid, f.gid)
	case f.perm&0o4000 != 0 && !p.has(capFowner) && !p.UIDs.Has(f.uid):
		return refuse(0, image, "mode", "%s: set-uid %d", f.name, f.uid)
	case f.perm&0o2000 != 0 && !p.has(capFsetid) && !p.GIDs.Has(f.gid):
		return refuse(0, image, "mode", "%s: set-gid %d", f.name, f.gid)
	}
	return nil
}

// judgeGhost judges a deleted file CRIU remakes, as its image g says.
func judgeGhost(image string, g *ghostfile.GhostFileEntry, p Policy) error {
	mode, uid, gid, rdev := g.GetMode(), g.GetUid(), g.GetGid(), g.GetRdev()
	kinds := map[uint32]byte{0o100000: 'r', 0o040000: 'd', 0o120000: 'l', 0o010000: 'p', 0o020000: 'c', 0o060000: 'b'}
	k := kinds[mode&0o170000]
	// CRIU keeps rdev in the kernel's old encoding (major<<8 | minor).
	return judgeFile(image, file{name: image, kind: k, perm: mode & 0o7777, uid: uid, gid: gid, major: rdev >> 8 & 0xfff, minor: rdev&0xff | rdev>>12&0xfff00}, p)
}

// judgeTar refuses a tmpfs tarball with a member named outside the tmpfs
// (absolute, "..", or through a symbolic link the tarball makes: the tar
// that extracts it would follow it), a hard link to outside it, or a file
// the unit could not have made (judgeFile).
func judgeTar(image string, hs []*tar.Header, p Policy) error {
	links := map[string]bool{}
	kinds := map[byte]byte{tar.TypeReg: 'r', tar.TypeDir: 'd', tar.TypeSymlink: 'l', tar.TypeFifo: 'p', tar.TypeChar: 'c', tar.TypeBlock: 'b', tar.TypeLink: 'h'}
	for _, h := range hs {
		if !within(h.Name) {
			return refuse(0, image, "name", "%q: outside the tmpfs", h.Name)
		}
		name := path.Clean("./" + h.Name)
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if links[dir] {
				return refuse(0, image, "name", "%q: through the symbolic link %q", h.Name, dir)
			}
		}
		if h.Typeflag == tar.TypeSymlink {
			links[name] = true
		}
		if h.Typeflag == tar.TypeLink && !within(h.Linkname) {
			return refuse(0, image, "linkname", "%q: a hard link to %q, outside the tmpfs", h.Name, h.Linkname)
		}
		if h.Uid < 0 || h.Gid < 0 || h.Uid > 1<<32-1 || h.Gid > 1<<32-1 || h.Devmajor < 0 || h.Devminor < 0 ||
			h.Devmajor > 1<<32-1 || h.Devminor > 1<<32-1 {
			return refuse(0, image, "uid", "%q: ids out of range", h.Name)
		}
		f := file{name: "/" + name, kind: kinds[h.Typeflag], perm: uint32(h.Mode & 0o7777), uid: uint32(h.Uid), gid: uint32(h.Gid),
			major: uint32(h.Devmajor), minor: uint32(h.Devminor)}
		if err := judgeFile(image, f, p); err != nil {
			return err
		}
	}
	return nil
}

// within says whether a tar member's name stays within the directory it
// is extracted into: relative, and no ".." component.
func within(name string) bool {
	return len(name) <= 4096 && !strings.HasPrefix(name, "/") && !slices.Contains(strings.Split(name, "/"), "..")
}

// judgeCgroups refuses cgroups outside the sandbox's own. Every
// controller names one top directory, the same for all: the sandbox's
// cgroup as it was dumped, which the restore replaces with the new
// sandbox's (runc's --cgroup-root). Directories below it are clean
// relative names. Every cgroup set (where CRIU moves a task) names the
// sandbox's cgroup or a directory below it: CRIU rewrites only paths
// under the dumped root, and takes any other from the root of the host's
// hierarchy.
func judgeCgroups(c *cgroup.CgroupEntry) error {
	var walk func(ds []*cgroup.CgroupDirEntry, depth int) error
	walk = func(ds []*cgroup.CgroupDirEntry, depth int) error {
		if depth > 64 {
			return refuse(0, "cgroup.img", "dir_name", "directories nested past 64")
		}
		for _, d := range ds {
			if n := d.GetDirName(); !cleanRelative(n) {
				return refuse(0, "cgroup.img", "dir_name", "%q is not below the sandbox's cgroup", n)
			}
			if err := walk(d.GetChildren(), depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	top := ""
	for _, ctl := range c.GetControllers() {
		for _, d := range ctl.GetDirs() {
			if n := d.GetDirName(); top == "" {
				top = n
			} else if n != top {
				return refuse(0, "cgroup.img", "dir_name", "%q beside %q: one sandbox cgroup, not two", n, top)
			}
		}
		if err := walk(ctl.GetDirs(), 0); err != nil {
			return err
		}
	}
	for _, set := range c.GetSets() {
		for _, ctl := range set.GetCtls() {
			p := ctl.GetPath()
			rest, ok := strings.CutPrefix(p, "/"+top)
			if top == "" || !ok || rest != "" && (!strings.HasPrefix(rest, "/") || !cleanRelative(rest[1:])) {
				return refuse(0, "cgroup.img", "sets.ctls.path", "set %d: %q is not the sandbox's cgroup or below it", set.GetId(), p)
			}
		}
	}
	return nil
}

// cleanRelative says whether name is a relative path of non-empty
// components, none of them "." or "..".
func cleanRelative(name string) bool {
	if name == "" || len(name) > 4096 {
		return false
	}
	for _, c := range strings.Split(name, "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
	}
	return true
}
