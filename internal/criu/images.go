package criu

import (
	"archive/tar"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	ghostfile "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/ns"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/seccomp"
	skunix "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-unix"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/userns"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Limits of what Read reads: an image directory is hostile input.
const (
	// MaxFiles is the most files an image directory may hold.
	MaxFiles = 1 << 16
	// MaxImage is the largest image read (every image but the pages,
	// which are never read); MaxImages bounds them all together.
	MaxImage  = 16 << 20
	MaxImages = 64 << 20
	// MaxEntries is the most entries of one image.
	MaxEntries = 1 << 20
	// maxTar bounds what a tmpfs tarball's members and names add up to
	// once decompressed: a tmpfs of a sandbox here holds device nodes
	// and empty directories.
	maxTar = 16 << 20
)

// CRIU's image magics (criu/include/magic.h): every image but a raw one
// starts with imgCommon (or imgService) and its own magic.
const (
	imgCommon  = 0x54564319
	imgService = 0x55105940
	rawMagic   = 0 // no header: pages, tarballs
	// inventoryMagic and statsMagic start their images alone.
	inventoryMagic = 0x58313116
	statsMagic     = 0x57093306
	ghostMagic     = 0x52583605
)

// verdict is what a kind of image is to this host.
type verdict int

const (
	// refused: a dump here never writes one, or it grants what no
	// spec here grants; present, the directory is refused.
	refused verdict = iota
	// harmless: it grants nothing past what the task's own namespaces,
	// memory and open files already are; its framing is checked.
	harmless
	// checked: decoded and judged field by field.
	checked
	// unread: the memory's pages, never read (their pagemap says where
	// they go; what a unit's memory holds grants nothing).
	unread
)

// kind is a kind of CRIU image: its file name (prefix, the number
// CRIU puts in it, if any, and the suffix) and its magic.
type kind struct {
	prefix string
	arg    byte // 0: none; 'd': decimal; 'x': hex
	suffix string
	magic  uint32
	verdict
	why string // the reason of its verdict (docs/trust.md's table)
}

// kinds are the images of CRIU 4.2 (criu/image-desc.c) and runc's own
// descriptors.json, each with its verdict. A file no kind names is
// refused.
var kinds = []kind{
	{"inventory", 0, ".img", 0x58313116, checked, "decoded: the root task's namespace ids"},
	{"pstree", 0, ".img", 0x50273030, checked, "the tasks and threads whose images are judged"},
	{"core-", 'd', ".img", 0x55053847, checked, "every thread: ids within the run's, no capability the spec lacks (effective, permitted, inheritable, bounding, ambient), securebits 0, no_new_privs on, no LSM profile, seccomp in filter mode (strict or none only for a thread sharing its leader's filters; never an older image's per-task mode), the task core present; every task: at most 64 limits, none missing before one the spec sets unless the spec sets its resource, limits and oom_score_adj narrowed to the spec's"},
	{"ids-", 'd', ".img", 0x54432030, checked, "every task in the root task's namespaces, and those the sandbox's"},
	{"mm-", 'd', ".img", 0x57492820, checked, "the executable's file, judged as an open file"},
	{"fs-", 'd', ".img", 0x51403912, checked, "the root and working directory, judged as open files"},
	{"mountpoints-", 'd', ".img", 0x55563928, checked, "every mount is one the spec makes, at its place, of its type, with the spec's ro, nosuid, nodev, noexec"},
	{"files", 0, ".img", 0x56303138, checked, "every open file: clean absolute paths within the sandbox, unix sockets named by absolute paths and connected only to the unit's, kinds no spec here grants refused"},
	{"fdinfo-", 'd', ".img", 0x56213732, checked, "descriptors name files of an allowed kind"},
	{"reg-files", 0, ".img", 0x50363636, checked, "paths within the sandbox (older images)"},
	{"unixsk", 0, ".img", 0x54373943, checked, "socket names within the sandbox (older images)"},
	{"ns-files", 0, ".img", 0x61394011, checked, "only the task's own namespaces"},
	{"ghost-file-", 'x', ".img", 0x52583605, checked, "a deleted file remade: only one the unit could make itself under the spec's capabilities (device node, owner, set-id bits)"},
	{"tmpfs-", 'd', ".tar.gz.img", rawMagic, checked, "a tmpfs's files: names within it and not through its own symbolic links, each judged as a ghost file"},
	{"tmpfs-dev-", 'd', ".tar.gz.img", rawMagic, checked, "as tmpfs"},
	{"cgroup", 0, ".img", 0x59383330, checked, "one sandbox cgroup; directories, and the cgroups tasks are put in, below it (CRIU rewrites only paths under the dumped root); the kernel holds a child's limits within its parent's"},
	{"descriptors", 0, ".json", rawMagic, checked, "runc's list of the stdio descriptors it reconnects: at most three names"},
	{"pagemap-", 'd', ".img", 0x56084025, harmless, "where the unit's own pages go in its own address space"},
	{"pagemap-shmem-", 'd', ".img", 0x56084025, harmless, "as pagemap, for shared memory"},
	{"pages-", 'd', ".img", rawMagic, unread, "the unit's memory: never read"},
	{"seccomp", 0, ".img", 0x64413049, checked, "every thread's filters: 1 to 4096 instructions each, at most 32768 in a chain, no loop, indexes in range, flags TSYNC and LOG at most; the restore installs the spec's filter, as this host's runc compiles it, before them (filters only narrow, so theirs need no comparison)"},
	{"pipes", 0, ".img", 0x56513555, harmless, "pipes between the unit's tasks"},
	{"pipes-data", 0, ".img", 0x56453709, harmless, "bytes queued in them"},
	{"fifo", 0, ".img", 0x58364939, harmless, "a FIFO's path is its files entry's, checked there"},
	{"fifo-data", 0, ".img", 0x59333054, harmless, "bytes queued in FIFOs"},
	{"remap-fpath", 0, ".img", 0x59133954, harmless, "links between open files whose paths are checked"},
	{"memfd", 0, ".img", 0x48453499, harmless, "anonymous memory files"},
	{"eventfd", 0, ".img", 0x44523722, harmless, "a counter"},
	{"eventpoll", 0, ".img", 0x45023858, harmless, "a set of the unit's descriptors"},
	{"eventpoll-tfd", 0, ".img", 0x44433746, harmless, "as eventpoll"},
	{"signalfd", 0, ".img", 0x57323820, harmless, "a signal mask"},
	{"timerfd", 0, ".img", 0x50493712, harmless, "a timer"},
	{"pidfd", 0, ".img", 0x54435556, harmless, "a descriptor of one of the unit's tasks"},
	{"inetsk", 0, ".img", 0x56443851, harmless, "sockets of the sandbox's own network namespace"},
	{"packetsk", 0, ".img", 0x60454618, harmless, "as inetsk"},
	{"netlinksk", 0, ".img", 0x58005614, harmless, "as inetsk"},
	{"sk-queues", 0, ".img", 0x56264026, harmless, "bytes queued in sockets"},
	{"tcp-stream-", 'x', ".img", 0x51465506, harmless, "a TCP connection's state, in the sandbox's own network namespace"},
	{"filelocks", 0, ".img", 0x54323616, harmless, "locks on files the unit holds open"},
	{"sigacts-", 'd', ".img", 0x55344201, harmless, "signal handlers"},
	{"signal-s-", 'd', ".img", 0x59255647, harmless, "pending signals"},
	{"signal-p-", 'd', ".img", 0x59255647, harmless, "pending signals"},
	{"itimers-", 'd', ".img", 0x57464056, harmless, "timers"},
	{"posix-timers-", 'd', ".img", 0x52603957, harmless, "timers"},
	{"utsns-", 'd', ".img", 0x54473203, harmless, "the host name of the sandbox's own UTS namespace"},
	{"ipcns-var-", 'd', ".img", 0x53115007, harmless, "the sandbox's own IPC namespace"},
	{"ipcns-shm-", 'd', ".img", 0x46283044, harmless, "as ipcns-var"},
	{"ipcns-msg-", 'd', ".img", 0x55453737, harmless, "as ipcns-var"},
	{"ipcns-sem-", 'd', ".img", 0x59573019, harmless, "as ipcns-var"},
	{"timens-", 'd', ".img", 0x43114433, harmless, "clock offsets the unit alone sees"},
	{"netns-", 'd', ".img", 0x55933752, harmless, "the network namespace's settings: it is the sandbox's own, made by this host, which runc has CRIU join"},
	{"cpuinfo", 0, ".img", 0x61404013, harmless, "CPU features a restore checks"},
	{"stats-dump", 0, "", 0x57093306, harmless, "CRIU's statistics"},
	{"stats-restore", 0, "", 0x57093306, harmless, "CRIU's statistics"},
	{"creds-", 'd', ".img", 0x54023547, refused, "older images' credentials: CRIU 4 keeps them in core"},
	{"vmas-", 'd', ".img", 0x54123737, refused, "older images' mappings: CRIU 4 keeps them in mm"},
	{"rlimit-", 'd', ".img", 0x57113925, refused, "older images' limits: CRIU 4 keeps them in core"},
	{"ext-files", 0, ".img", 0x59255641, refused, "files a plugin restores"},
	{"inotify", 0, ".img", 0x48424431, refused, "watches are restored by file handle, which opens any inode of a filesystem"},
	{"inotify-wd", 0, ".img", 0x54562009, refused, "as inotify"},
	{"fanotify", 0, ".img", 0x55096122, refused, "as inotify; needs CAP_SYS_ADMIN"},
	{"fanotify-mark", 0, ".img", 0x56506035, refused, "as fanotify"},
	{"irmap-cache", 0, ".img", 0x57004059, refused, "file handles to paths, for inotify"},
	{"tty", 0, ".img", 0x59433025, refused, "a sandbox here has no terminal"},
	{"tty-info", 0, ".img", 0x59453036, refused, "as tty"},
	{"tty-data", 0, ".img", 0x59413026, refused, "as tty"},
	{"tunfile", 0, ".img", 0x57143751, refused, "a TUN device: no spec here grants /dev/net/tun"},
	{"netdev-", 'd', ".img", 0x57373951, refused, "network devices: the sandbox's network namespace is this host's, never restored"},
	{"ifaddr-", 'd', ".img", rawMagic, refused, "as netdev"},
	{"route-", 'd', ".img", rawMagic, refused, "as netdev"},
	{"route6-", 'd', ".img", rawMagic, refused, "as netdev"},
	{"rule-", 'd', ".img", rawMagic, refused, "as netdev"},
	{"iptables-", 'd', ".img", rawMagic, refused, "as netdev"},
	{"ip6tables-", 'd', ".img", rawMagic, refused, "as netdev"},
	{"nftables-", 'd', ".img", rawMagic, refused, "as netdev"},
	{"netns-ct-", 'd', ".img", 0x0, refused, "as netdev"},
	{"netns-exp-", 'd', ".img", 0x0, refused, "as netdev"},
	{"userns-", 'd', ".img", 0x55474906, checked, "the uid and gid maps of the sandbox's own user namespace: exactly the run's range on this host, one extent each (rewritten to it before the restore)"},
	{"pidns-", 'd', ".img", 0x61157326, refused, "a PID namespace other than the sandbox's"},
	{"autofs-", 'd', ".img", rawMagic, refused, "an automounter: needs CAP_SYS_ADMIN"},
	{"binfmt-misc", 0, ".img", 0x67343323, refused, "interpreters registered for the whole host"},
	{"binfmt-misc-", 'd', ".img", 0x67343323, refused, "as binfmt-misc"},
	{"bpfmap-file", 0, ".img", 0x57506142, refused, "BPF maps: need CAP_BPF or CAP_SYS_ADMIN"},
	{"bpfmap-data", 0, ".img", 0x64324033, refused, "as bpfmap-file"},
	{"apparmor", 0, ".img", 0x59423047, refused, "AppArmor policy loaded into the host's kernel"},
	{"pages-shmem-", 'd', ".img", rawMagic, refused, "older images' shared memory"},
}

// kindOf is the kind of the file named name, and the number in its name;
// false when no kind names it. A number is in canonical form (core-07.img
// is not task 7's: CRIU reads core-7.img). The longest prefix wins
// (tmpfs-dev- over tmpfs-).
func kindOf(name string) (*kind, uint64, bool) {
	var best *kind
	var num uint64
	for i := range kinds {
		k := &kinds[i]
		rest, ok := strings.CutPrefix(name, k.prefix)
		if !ok {
			continue
		}
		rest, ok = strings.CutSuffix(rest, k.suffix)
		if !ok {
			continue
		}
		var n uint64
		switch k.arg {
		case 0:
			if rest != "" {
				continue
			}
		case 'd':
			v, err := strconv.ParseUint(rest, 10, 32)
			if err != nil || strconv.FormatUint(v, 10) != rest {
				continue
			}
			n = v
		case 'x':
			v, err := strconv.ParseUint(rest, 16, 32)
			if err != nil || strconv.FormatUint(v, 16) != rest {
				continue
			}
			n = v
		}
		if best == nil || len(k.prefix) > len(best.prefix) {
			best, num = k, n
		}
	}
	return best, num, best != nil
}

// Images is what a restore would read of an image directory that can
// grant authority, decoded.
type Images struct {
	Inventory *inventory.InventoryEntry
	Tasks     []*pstree.PstreeEntry
	// Cores are the threads' core images by thread id (core-TID.img).
	Cores map[uint32]*criucore.CoreEntry
	// CapAmb and NoNewPrivs are the fields of creds that go-criu's protos
	// lack (CRIU 4.2's images/creds.proto fields 19 and 18), by thread.
	CapAmb     map[uint32][]uint32
	NoNewPrivs map[uint32]*uint32
	IDs        map[uint32]*criucore.TaskKobjIdsEntry // ids-PID.img
	MMs        map[uint32]*mm.MmEntry
	FSs        map[uint32]*fs.FsEntry
	Mounts     map[uint32][]*mnt.MntEntry // mountpoints-NSID.img
	Files      []*fdinfo.FileEntry        // files.img
	FDs        map[uint32][]*fdinfo.FdinfoEntry
	RegFiles   []*regfile.RegFileEntry // reg-files.img (older images)
	UnixSks    []*skunix.UnixSkEntry   // unixsk.img (older images)
	NSFiles    []*ns.NsFileEntry       // ns-files.img
	Ghosts     map[string]*ghostfile.GhostFileEntry
	Tmpfs      map[string][]*tar.Header // tmpfs-*.tar.gz.img members
	Cgroups    []*cgroup.CgroupEntry
	// Seccomp is seccomp.img: every thread's filters.
	Seccomp *seccomp.SeccompEntry
	// Userns are the user namespaces' maps by namespace id
	// (userns-NSID.img).
	Userns map[uint32]*userns.UsernsEntry
	// Descriptors is runc's descriptors.json.
	Descriptors []string
	// Names are every file's name, sorted.
	Names []string
}

// Read reads the image directory dir (Decode of its files).
func Read(dir string) (*Images, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	if len(des) > MaxFiles {
		return nil, refuse(0, filepath.Base(dir), "", "%d files, the limit is %d", len(des), MaxFiles)
	}
	files := make([]File, len(des))
	for i, de := range des {
		files[i] = File{Name: de.Name(), Path: filepath.Join(dir, de.Name())}
	}
	return Decode(files)
}

// File is one file of an image directory: its name there, and the file
// that holds it.
type File struct{ Name, Path string }

// Decode decodes an image directory's files: every one must be of a kind
// CRIU writes (kinds), a regular file, and within the limits; the
// refused kinds are refused here. The pages are never opened.
func Decode(files []File) (*Images, error) {
	if len(files) > MaxFiles {
		return nil, refuse(0, "", "", "%d files, the limit is %d", len(files), MaxFiles)
	}
	im := newImages()
	var total int64
	for _, f := range files {
		k, _, ok := kindOf(f.Name)
		if !ok {
			return nil, refuse(0, f.Name, "", "not an image CRIU writes")
		}
		if k.verdict == refused {
			return nil, refuse(0, f.Name, "", "refused: %s", k.why)
		}
		fi, err := os.Lstat(f.Path)
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, refuse(0, f.Name, "", "not a regular file")
		}
		if k.verdict == unread {
			im.Names = append(im.Names, f.Name)
			continue
		}
		if fi.Size() > MaxImage {
			return nil, refuse(0, f.Name, "", "%d bytes, the limit is %d", fi.Size(), MaxImage)
		}
		if total += fi.Size(); total > MaxImages {
			return nil, refuse(0, f.Name, "", "images of more than %d bytes in all", MaxImages)
		}
		b, err := os.ReadFile(f.Path)
		if err != nil {
			return nil, err
		}
		if err := im.addFile(f.Name, b); err != nil {
			return nil, err
		}
	}
	sort.Strings(im.Names)
	return im, nil
}

func newImages() *Images {
	return &Images{
		Cores: map[uint32]*criucore.CoreEntry{}, CapAmb: map[uint32][]uint32{}, NoNewPrivs: map[uint32]*uint32{},
		IDs: map[uint32]*criucore.TaskKobjIdsEntry{}, MMs: map[uint32]*mm.MmEntry{}, FSs: map[uint32]*fs.FsEntry{},
		Mounts: map[uint32][]*mnt.MntEntry{}, FDs: map[uint32][]*fdinfo.FdinfoEntry{},
		Ghosts: map[string]*ghostfile.GhostFileEntry{}, Tmpfs: map[string][]*tar.Header{},
		Userns: map[uint32]*userns.UsernsEntry{},
	}
}

// addFile decodes image file name, whose bytes are b, into im.
func (im *Images) addFile(name string, b []byte) error {
	k, n, ok := kindOf(name)
	switch {
	case !ok:
		return refuse(0, name, "", "not an image CRIU writes")
	case k.verdict == refused:
		return refuse(0, name, "", "refused: %s", k.why)
	case len(b) > MaxImage: // grown since it was judged by its size
		return refuse(0, name, "", "more than %d bytes", MaxImage)
	}
	im.Names = append(im.Names, name)
	if k.verdict == unread {
		return nil
	}
	return im.add(k, uint32(n), name, b)
}

// add decodes image name, of kind k and number n, into im.
func (im *Images) add(k *kind, n uint32, name string, b []byte) error {
	switch k.prefix {
	case "tmpfs-", "tmpfs-dev-":
		hs, err := readTar(b)
		if err != nil {
			return refuse(0, name, "", "%v", err)
		}
		im.Tmpfs[name] = hs
		return nil
	case "descriptors":
		if err := json.Unmarshal(b, &im.Descriptors); err != nil {
			return refuse(0, name, "", "not a JSON list of names: %v", err)
		}
		return nil
	}
	entries, err := frames(b, k.magic)
	if err != nil {
		return refuse(0, name, "", "%v", err)
	}
	one := func(m proto.Message) error {
		if len(entries) != 1 {
			return refuse(0, name, "", "%d entries, CRIU writes one", len(entries))
		}
		if err := proto.Unmarshal(entries[0], m); err != nil {
			return refuse(0, name, "", "%v", err)
		}
		return nil
	}
	each := func(m func() proto.Message) error {
		for i, e := range entries {
			if err := proto.Unmarshal(e, m()); err != nil {
				return refuse(0, name, "", "entry %d: %v", i, err)
			}
		}
		return nil
	}
	switch k.prefix {
	case "inventory":
		im.Inventory = &inventory.InventoryEntry{}
		return one(im.Inventory)
	case "pstree":
		return each(func() proto.Message { t := &pstree.PstreeEntry{}; im.Tasks = append(im.Tasks, t); return t })
	case "core-":
		c := &criucore.CoreEntry{}
		if err := one(c); err != nil {
			return err
		}
		im.Cores[n] = c
		if cr := c.GetThreadCore().GetCreds(); cr != nil {
			amb, nnp, err := credsExtra(cr.ProtoReflect().GetUnknown())
			if err != nil {
				return refuse(n, name, "creds", "%v", err)
			}
			im.CapAmb[n], im.NoNewPrivs[n] = amb, nnp
		}
		return nil
	case "ids-":
		im.IDs[n] = &criucore.TaskKobjIdsEntry{}
		return one(im.IDs[n])
	case "mm-":
		im.MMs[n] = &mm.MmEntry{}
		return one(im.MMs[n])
	case "fs-":
		im.FSs[n] = &fs.FsEntry{}
		return one(im.FSs[n])
	case "mountpoints-":
		return each(func() proto.Message { m := &mnt.MntEntry{}; im.Mounts[n] = append(im.Mounts[n], m); return m })
	case "files":
		return each(func() proto.Message { f := &fdinfo.FileEntry{}; im.Files = append(im.Files, f); return f })
	case "fdinfo-":
		return each(func() proto.Message { f := &fdinfo.FdinfoEntry{}; im.FDs[n] = append(im.FDs[n], f); return f })
	case "reg-files":
		return each(func() proto.Message { f := &regfile.RegFileEntry{}; im.RegFiles = append(im.RegFiles, f); return f })
	case "unixsk":
		return each(func() proto.Message { f := &skunix.UnixSkEntry{}; im.UnixSks = append(im.UnixSks, f); return f })
	case "ns-files":
		return each(func() proto.Message { f := &ns.NsFileEntry{}; im.NSFiles = append(im.NSFiles, f); return f })
	case "ghost-file-":
		// A ghost file's entry, then its bytes (raw, or in chunks):
		// only the entry is judged.
		if len(entries) == 0 {
			return refuse(0, name, "", "no entry")
		}
		g := &ghostfile.GhostFileEntry{}
		if err := proto.Unmarshal(entries[0], g); err != nil {
			return refuse(0, name, "", "%v", err)
		}
		im.Ghosts[name] = g
		return nil
	case "userns-":
		im.Userns[n] = &userns.UsernsEntry{}
		return one(im.Userns[n])
	case "seccomp":
		if len(entries) == 0 { // CRIU's image of no filter
			return nil
		}
		im.Seccomp = &seccomp.SeccompEntry{}
		return one(im.Seccomp)
	case "cgroup":
		return each(func() proto.Message { c := &cgroup.CgroupEntry{}; im.Cgroups = append(im.Cgroups, c); return c })
	}
	return nil // harmless: framing checked
}

// Images whose entries carry data after them (CRIU's image.c and the
// dumps that write them): in dataAfterEach every entry is followed by as
// many bytes as its field 2 says (a pipe's or FIFO's queued bytes, a
// socket's queued packet); in dataAfterFirst the one entry is followed by
// data to the file's end (a ghost file's bytes, a TCP connection's queues,
// a System V segment's or queue's contents), never split.
var (
	dataAfterEach  = map[uint32]bool{0x56453709: true, 0x59333054: true, 0x56264026: true}                   // pipes-data, fifo-data, sk-queues
	dataAfterFirst = map[uint32]bool{ghostMagic: true, 0x51465506: true, 0x46283044: true, 0x55453737: true} // ghost-file, tcp-stream, ipcns-shm, ipcns-msg
)

// dataLength is field 2 of entry e, a varint: how many bytes of data
// follow the entry.
func dataLength(e []byte) (uint64, error) {
	for len(e) > 0 {
		num, typ, n := protowire.ConsumeTag(e)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		e = e[n:]
		if num == 2 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(e)
			if m < 0 {
				return 0, protowire.ParseError(m)
			}
			return v, nil
		}
		m := protowire.ConsumeFieldValue(num, typ, e)
		if m < 0 {
			return 0, protowire.ParseError(m)
		}
		e = e[m:]
	}
	return 0, errors.New("no length of its data")
}

// frames splits an image into its entries: the magics, then entries of a
// u32 little-endian length and that many bytes, passing over the data
// some kinds carry after an entry (above). A raw image (magic 0) is not
// framed, and has no entries here.
func frames(b []byte, magic uint32) ([][]byte, error) {
	if magic == rawMagic {
		return nil, nil
	}
	// The inventory and the statistics have their own magic alone
	// (criu/image.c); every other image the set's first.
	if magic != inventoryMagic && magic != statsMagic {
		if len(b) < 4 {
			return nil, errors.New("no magic")
		}
		if m := binary.LittleEndian.Uint32(b); m != imgCommon && m != imgService {
			return nil, fmt.Errorf("magic %#x is not CRIU's", m)
		}
		b = b[4:]
	}
	if len(b) < 4 {
		return nil, errors.New("no magic")
	}
	if m := binary.LittleEndian.Uint32(b); m != magic {
		return nil, fmt.Errorf("magic %#x, not the image's %#x", m, magic)
	}
	b = b[4:]
	var out [][]byte
	for len(b) > 0 {
		if len(out) == MaxEntries {
			return nil, fmt.Errorf("more than %d entries", MaxEntries)
		}
		if len(b) < 4 || uint64(binary.LittleEndian.Uint32(b)) > uint64(len(b)-4) {
			return nil, errors.New("truncated entry")
		}
		n := binary.LittleEndian.Uint32(b)
		e := b[4 : 4+n]
		out = append(out, e)
		b = b[4+n:]
		if dataAfterFirst[magic] { // the rest is data: a file's bytes, a queue's
			return out, nil
		}
		if dataAfterEach[magic] {
			d, err := dataLength(e)
			if err != nil {
				return nil, fmt.Errorf("entry %d: %w", len(out)-1, err)
			}
			if d > uint64(len(b)) {
				return nil, fmt.Errorf("entry %d: %d bytes of data, %d left", len(out)-1, d, len(b))
			}
			b = b[d:]
		}
	}
	return out, nil
}

// credsExtra decodes the creds fields go-criu's protos lack from their
// unknown bytes: no_new_privs (18, uint32) and cap_amb (19, repeated
// uint32, packed or not).
func credsExtra(b []byte) (amb []uint32, nnp *uint32, err error) {
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, nil, errors.New("bad field key")
		}
		b = b[n:]
		field, wire := key>>3, key&7
		switch wire {
		case 0:
			v, m := binary.Uvarint(b)
			if m <= 0 {
				return nil, nil, errors.New("bad varint")
			}
			b = b[m:]
			if v > 1<<32-1 && (field == 18 || field == 19) {
				return nil, nil, fmt.Errorf("field %d: %d is past uint32", field, v)
			}
			switch field {
			case 18:
				x := uint32(v)
				nnp = &x
			case 19:
				if len(amb) == 64 {
					return nil, nil, errors.New("cap_amb: more than 64 words")
				}
				amb = append(amb, uint32(v))
			}
		case 2:
			l, m := binary.Uvarint(b)
			if m <= 0 || l > uint64(len(b)-m) {
				return nil, nil, errors.New("truncated field")
			}
			p := b[m : m+int(l)]
			b = b[m+int(l):]
			for field == 19 && len(p) > 0 {
				v, k := binary.Uvarint(p)
				if k <= 0 || v > 1<<32-1 || len(amb) == 64 {
					return nil, nil, errors.New("cap_amb: bad packed words")
				}
				amb = append(amb, uint32(v))
				p = p[k:]
			}
		case 5:
			if len(b) < 4 {
				return nil, nil, errors.New("truncated field")
			}
			b = b[4:]
		case 1:
			if len(b) < 8 {
				return nil, nil, errors.New("truncated field")
			}
			b = b[8:]
		default:
			return nil, nil, fmt.Errorf("field %d: wire type %d", field, wire)
		}
	}
	return amb, nnp, nil
}

// readTar lists a tmpfs tarball's members (gzip), within maxTar.
func readTar(b []byte) ([]*tar.Header, error) {
	zr, err := gzip.NewReader(strings.NewReader(string(b)))
	if err != nil {
		return nil, err
	}
	lr := &io.LimitedReader{R: zr, N: maxTar}
	tr := tar.NewReader(lr)
	var out []*tar.Header
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			if lr.N <= 0 {
				return nil, fmt.Errorf("more than %d bytes once decompressed", maxTar)
			}
			return nil, err
		}
		if len(out) == MaxEntries {
			return nil, fmt.Errorf("more than %d members", MaxEntries)
		}
		out = append(out, h)
	}
}

// docName is a kind's file name as docs/trust.md writes it: core-N.img,
// ghost-file-X.img.
func docName(k kind) string {
	arg := ""
	switch k.arg {
	case 'd':
		arg = "N"
	case 'x':
		arg = "X"
	}
	return k.prefix + arg + k.suffix
}
