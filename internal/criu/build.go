package criu

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// BuildFile is where deploy/setup.sh installs the record of the CRIU it
// built (docs/setup.md, "The CRIU build").
const BuildFile = "/usr/local/share/runrecordd/criu.json"

// Bounds of what [ReadBuildRecord] and [Identify] read.
const (
	maxBuildRecord = 64 << 10  // bytes of a build record
	maxPatches     = 64        // patches a record may list
	maxBinary      = 256 << 20 // bytes of a criu binary hashed
)

var (
	// ErrNoBuildRecord is a build record that is not there: a CRIU that
	// deploy/setup.sh did not build (a distro's, one built by hand).
	ErrNoBuildRecord = errors.New("criu: no build record")
	// ErrBuildRecord is a build record that cannot be read or is not one.
	ErrBuildRecord = errors.New("criu: bad build record")
	// ErrOtherBinary is a criu binary whose bytes are not the ones the
	// build record describes (replaced since setup ran).
	ErrOtherBinary = errors.New("criu: the binary is not the build its record describes")
)

// BuildRecord is what deploy/setup.sh records of the CRIU it built and
// installed: the version, the source tarball, each patch applied (in the
// order applied) and the installed binary, each by its sha256.
type BuildRecord struct {
	Version      string   `json:"version"`
	Binary       string   `json:"binary"`
	BinarySHA256 string   `json:"binary_sha256"`
	Source       Hashed   `json:"source"`
	Patches      []Hashed `json:"patches"`
	RunDir       string   `json:"rundir,omitempty"`
}

// Hashed is a file of a build by name and sha256 (lower-case hex).
type Hashed struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

var (
	versionRE = regexp.MustCompile(`^[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?$`)
	sha256RE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	sourceRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)
	patchRE   = regexp.MustCompile(`^[0-9]{1,3}-[A-Za-z0-9._-]{1,120}\.patch$`)
)

// ReadBuildRecord reads and checks the build record at path: at most 64
// KiB of JSON, no field it does not know, every name and hash well formed.
// A file that is not there is [ErrNoBuildRecord]; anything else wrong is
// [ErrBuildRecord].
func ReadBuildRecord(path string) (BuildRecord, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return BuildRecord{}, fmt.Errorf("%w at %s", ErrNoBuildRecord, path)
	}
	if err != nil {
		return BuildRecord{}, fmt.Errorf("%w: %w", ErrBuildRecord, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return BuildRecord{}, fmt.Errorf("%w: %s is not a regular file", ErrBuildRecord, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxBuildRecord+1))
	if err != nil {
		return BuildRecord{}, fmt.Errorf("%w: %w", ErrBuildRecord, err)
	}
	if len(b) > maxBuildRecord {
		return BuildRecord{}, fmt.Errorf("%w: %s is over %d bytes", ErrBuildRecord, path, maxBuildRecord)
	}
	m, err := DecodeBuildRecord(b)
	if err != nil {
		return BuildRecord{}, fmt.Errorf("%w (%s)", err, path)
	}
	return m, nil
}

// DecodeBuildRecord decodes and checks a build record's bytes.
func DecodeBuildRecord(b []byte) (BuildRecord, error) {
	if len(b) > maxBuildRecord {
		return BuildRecord{}, fmt.Errorf("%w: over %d bytes", ErrBuildRecord, maxBuildRecord)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m BuildRecord
	if err := dec.Decode(&m); err != nil {
		return BuildRecord{}, fmt.Errorf("%w: %w", ErrBuildRecord, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return BuildRecord{}, fmt.Errorf("%w: data after the object", ErrBuildRecord)
	}
	if err := m.check(); err != nil {
		return BuildRecord{}, fmt.Errorf("%w: %w", ErrBuildRecord, err)
	}
	return m, nil
}

func (m *BuildRecord) check() error {
	switch {
	case !versionRE.MatchString(m.Version):
		return fmt.Errorf("version %.40q", m.Version)
	case !filepath.IsAbs(m.Binary) || len(m.Binary) > 4096 || strings.ContainsRune(m.Binary, 0) || filepath.Clean(m.Binary) != m.Binary:
		return fmt.Errorf("binary %.80q: want a clean absolute path", m.Binary)
	case !sha256RE.MatchString(m.BinarySHA256):
		return fmt.Errorf("binary_sha256 %.80q", m.BinarySHA256)
	case !sourceRE.MatchString(m.Source.Name) || !sha256RE.MatchString(m.Source.SHA256):
		return fmt.Errorf("source %.80q %.80q", m.Source.Name, m.Source.SHA256)
	case len(m.Patches) > maxPatches:
		return fmt.Errorf("%d patches, at most %d", len(m.Patches), maxPatches)
	case len(m.RunDir) > 4096 || (m.RunDir != "" && !filepath.IsAbs(m.RunDir)):
		return fmt.Errorf("rundir %.80q", m.RunDir)
	}
	seen := map[string]bool{}
	for i, p := range m.Patches {
		if !patchRE.MatchString(p.Name) || !sha256RE.MatchString(p.SHA256) {
			return fmt.Errorf("patch %d: %.80q %.80q", i, p.Name, p.SHA256)
		}
		if seen[p.Name] {
			return fmt.Errorf("patch %q listed twice", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// Capability is something the CRIU deploy/setup.sh builds can do that
// upstream CRIU 4.2.1 cannot: each comes from one patch of deploy/criu.
type Capability string

const (
	// LazyPagesWaits: lazy-pages waits in epoll while every remote
	// request is out, instead of spinning (patch 1).
	LazyPagesWaits Capability = "lazy-pages-waits"
	// KeepsUffds: lazy-pages keeps every task's userfaultfd until every
	// task's pages are in (patch 2); `serve --lazy-served` needs it.
	KeepsUffds Capability = "keeps-uffds"
	// TmpfsRestore: a small tmpfs restored in CRIU's own process, not by
	// tar (patch 3).
	TmpfsRestore Capability = "tmpfs-restore"
	// TmpfsDump: a small tmpfs dumped in CRIU's own process (patch 4).
	TmpfsDump Capability = "tmpfs-dump"
	// UsernsUffd: lazy-pages and restore open userfaultfd inside a user
	// namespace through /dev/userfaultfd (patch 5).
	UsernsUffd Capability = "userns-uffd"
	// UsernsCgroupns: a cgroup namespace restored after the user
	// namespace's credentials (patch 6).
	UsernsCgroupns Capability = "userns-cgroupns"
	// TmpfsUserns: patches 3 and 4's small tmpfs also in a user
	// namespace, and with empty regular files (patch 7).
	TmpfsUserns Capability = "tmpfs-userns"
	// TasksKeepUffds: each lazily restored task keeps its own
	// userfaultfd, and a dump leaves it out (patch 8): a unit cannot
	// outlive every holder of its userfaultfds and read zeros.
	TasksKeepUffds Capability = "tasks-keep-uffds"
)

// capabilityPatch is the patch of deploy/criu each capability comes from,
// and (where the patch adds one) a string only a binary built with it
// holds: a message of its log.
var capabilityPatch = []struct {
	c         Capability
	patch     string
	signature string
}{
	{LazyPagesWaits, "1-lazy-pages-wait.patch", ""},
	{KeepsUffds, "2-lazy-pages-keep-uffds.patch", ""},
	{TmpfsRestore, "3-tmpfs-small-restore.patch", "restored without tar (%d entries)"},
	{TmpfsDump, "4-tmpfs-small-dump.patch", "dumped without tar (%d entries)"},
	{UsernsUffd, "5-lazy-pages-userns-uffd.patch", "not permitted here, using /dev/userfaultfd"},
	{UsernsCgroupns, "6-restore-cgns-after-userns-creds.patch", ""},
	{TmpfsUserns, "7-tmpfs-small-userns.patch", "owners as its user namespace maps them"},
	{TasksKeepUffds, "8-restored-tasks-keep-uffds.patch", "the userfaultfd of a lazy restore"},
}

// Patch is the deploy/criu patch c comes from.
func Patch(c Capability) string {
	for _, cp := range capabilityPatch {
		if cp.c == c {
			return cp.patch
		}
	}
	return ""
}

// Build is the CRIU a daemon runs, as far as it is known: its record
// when the binary is the one the record describes, and what it can do.
type Build struct {
	// Binary is the criu binary identified (its path).
	Binary string
	// Record is the binary's build record; nil when it has none, or
	// one of another binary (Unknown says which).
	Record *BuildRecord
	// Unknown is why the build is not known, when Record is nil.
	Unknown string
	caps    []Capability
}

// Identify finds the criu binary bin (a path, or a name looked up on
// PATH), hashes it and reads the build record at recordPath. The
// record is taken only when its binary_sha256 is the binary's.
//
// What the build can do: a capability whose patch leaves a mark in the
// binary (its own log message: patches 3, 4, 5, 7 and 8) is had only when the
// binary holds that mark — and, when the record is taken, the record
// lists the patch too; a capability without a mark (patches 1, 2 and 6)
// only when the record is taken and lists its patch. A CRIU that is not
// known (no record, or another binary) thus has none of 1, 2 and 6.
// The error is not nil only when the binary cannot be read.
func Identify(bin, recordPath string) (Build, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return Build{}, fmt.Errorf("criu: %w", err)
	}
	b := Build{Binary: path}
	data, sum, err := readBinary(path)
	if err != nil {
		return b, err
	}
	m, merr := ReadBuildRecord(recordPath)
	switch {
	case merr != nil:
		b.Unknown = merr.Error()
	case m.BinarySHA256 != sum:
		b.Unknown = fmt.Sprintf("%v: %s hashes to %s, %s names %s", ErrOtherBinary, path, sum, recordPath, m.BinarySHA256)
	default:
		b.Record = &m
	}
	for _, cp := range capabilityPatch {
		has := cp.signature == "" || bytes.Contains(data, []byte(cp.signature))
		if b.Record != nil {
			has = has && slices.ContainsFunc(m.Patches, func(p Hashed) bool { return p.Name == cp.patch })
		} else if cp.signature == "" {
			has = false
		}
		if has {
			b.caps = append(b.caps, cp.c)
		}
	}
	return b, nil
}

// readBinary reads a criu binary of at most maxBinary bytes and its
// sha256.
func readBinary(path string) ([]byte, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("criu: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxBinary+1))
	if err != nil {
		return nil, "", fmt.Errorf("criu: reading %s: %w", path, err)
	}
	if len(data) > maxBinary {
		return nil, "", fmt.Errorf("criu: %s is over %d bytes", path, maxBinary)
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:]), nil
}

// Has says whether the build can do c.
func (b Build) Has(c Capability) bool { return slices.Contains(b.caps, c) }

// Capabilities is what the build can do, in patch order.
func (b Build) Capabilities() []Capability { return slices.Clone(b.caps) }

// Patches names the patches the build is known to carry: the record's
// when it is known, else the ones whose mark the binary holds.
func (b Build) Patches() []string {
	if b.Record != nil {
		out := make([]string, len(b.Record.Patches))
		for i, p := range b.Record.Patches {
			out[i] = p.Name
		}
		return out
	}
	var out []string
	for _, cp := range capabilityPatch {
		if b.Has(cp.c) {
			out = append(out, cp.patch)
		}
	}
	return out
}

// Lacks says why the build cannot do c (empty when it can): the patch it
// needs, and why the build is unknown if it is.
func (b Build) Lacks(c Capability) string {
	if b.Has(c) {
		return ""
	}
	why := fmt.Sprintf("the CRIU at %s lacks deploy/criu/%s", b.Binary, Patch(c))
	if b.Record == nil {
		why += " (its build is not known: " + b.Unknown + ")"
	}
	return why
}
