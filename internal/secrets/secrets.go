//go:build linux

// Package secrets keeps the values of runs' secrets on this host: the
// files a unit reads at /run/secrets/NAME (Target), on a tmpfs the daemon
// mounts at STATE/secrets, one directory per run. A value lives only
// there and in the request that gave it: never in a unit spec, a grant
// set (which names the secrets, pkg/unit), a record, a journal, a bundle,
// a log line or an event (docs/trust.md#secrets).
//
// A run's directory is bind-mounted read-only into each of its sandboxes
// (internal/forms); to runc and CRIU it is an external bind mount, so a
// checkpoint holds no file of it. The tmpfs outlives a daemon's restart
// and not the host's: after a reboot, an import or a migration the
// values are gone, and a resume must give them again ([ErrRequired]).
package secrets

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Target is where a unit finds its secrets: one file per name.
const Target = "/run/secrets"

// MaxValue is the size of the longest value.
const MaxValue = 64 << 10

// tmpfsOptions cap the tmpfs, every run's values together, at 256 MiB
// of memory, of which it uses what the files take: a page a value at
// least, and at most a request body (1 MiB) a run.
const tmpfsOptions = "mode=0700,size=256m"

// ErrRequired is a run that names secrets whose values this host does
// not hold and the request did not give: after a reboot, an import or a
// migration. The run stays as it was.
var ErrRequired = errors.New("the run's secrets are required")

// ErrNoSpace is a put the secrets tmpfs has no room for. The values held
// stay as they were.
var ErrNoSpace = errors.New("the secrets tmpfs is full")

// Values is this host's secret values, under dir (STATE/secrets).
type Values struct {
	dir string
	mu  sync.Mutex // serialises the tmpfs's mount
}

// New is the secret values kept under stateDir.
func New(stateDir string) *Values { return &Values{dir: filepath.Join(stateDir, "secrets")} }

// Names checks values, a request's, against names, the grant set's: the
// same names, each value at most MaxValue bytes. Values given for a run
// that names no secret, or not for every name, are refused: ErrRequired
// when a name has no value, unit.ErrInvalid otherwise. It never says a
// value.
func Names(names []string, values map[string]string) error {
	var missing []string
	for _, n := range names {
		if _, ok := values[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: no value for %s", ErrRequired, strings.Join(missing, ", "))
	}
	for n, v := range values {
		if !slices.Contains(names, n) {
			return fmt.Errorf("%w: a value for secret %q, which the grant set does not name", unit.ErrInvalid, n)
		}
		if len(v) > MaxValue {
			return fmt.Errorf("%w: secret %q: its value is %d bytes, at most %d", unit.ErrInvalid, n, len(v), MaxValue)
		}
	}
	return nil
}

// Dir is run's directory, made empty if it has none: a sandbox's mount
// source. The tmpfs is mounted first if it is not.
func (h *Values) Dir(run string) (string, error) {
	if err := h.mount(); err != nil {
		return "", err
	}
	d, err := h.runDir(run)
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(d, 0o500); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("secrets of %s: %w", run, full(err))
	}
	return d, nil
}

// stagingPrefix begins the name a value is written under before it is
// renamed in: '+' is in no secret's name (unit.CheckSecretName), so no
// secret is named as another's staged value.
const stagingPrefix = ".new+"

// Put makes values run's secrets here, replacing the ones it held: every
// file is written aside first, then each renamed in, so a sandbox that
// binds the directory already sees the new values, never a part of one.
// A put the tmpfs has no room for (ErrNoSpace), or that fails otherwise
// while writing, removes what it wrote aside and leaves the values held.
func (h *Values) Put(run string, values map[string]string) error {
	d, err := h.Dir(run)
	if err != nil {
		return err
	}
	names := slices.Sorted(maps.Keys(values))
	for _, n := range names {
		if err := unit.CheckSecretName(n); err != nil {
			return err
		}
	}
	var aside []string
	for _, n := range names {
		tmp := filepath.Join(d, stagingPrefix+n)
		aside = append(aside, tmp)
		if err := os.WriteFile(tmp, []byte(values[n]), 0o400); err != nil {
			for _, f := range aside {
				_ = os.Remove(f)
			}
			return fmt.Errorf("secrets of %s: %s: %w", run, n, full(err))
		}
	}
	for i, n := range names {
		if err := os.Rename(aside[i], filepath.Join(d, n)); err != nil {
			for _, f := range aside[i:] {
				_ = os.Remove(f)
			}
			return fmt.Errorf("secrets of %s: %s: %w", run, n, err)
		}
	}
	es, err := os.ReadDir(d)
	if err != nil {
		return err
	}
	for _, e := range es {
		if _, ok := values[e.Name()]; !ok {
			_ = os.Remove(filepath.Join(d, e.Name()))
		}
	}
	return nil
}

// Missing is the names of run's secrets this host holds no value for.
func (h *Values) Missing(run string, names []string) []string {
	if len(names) == 0 {
		return nil
	}
	d, err := h.runDir(run)
	if err != nil || !h.mounted() {
		return names
	}
	var out []string
	for _, n := range names {
		if fi, err := os.Lstat(filepath.Join(d, n)); err != nil || !fi.Mode().IsRegular() {
			out = append(out, n)
		}
	}
	return out
}

// Remove deletes run's values here.
func (h *Values) Remove(run string) error {
	d, err := h.runDir(run)
	if err != nil || !h.mounted() {
		return err
	}
	return os.RemoveAll(d)
}

// Runs are the runs this host holds values for.
func (h *Values) Runs() ([]string, error) {
	if !h.mounted() {
		return nil, nil
	}
	es, err := os.ReadDir(h.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range es {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// full is err, also ErrNoSpace when it says the tmpfs has no room left
// (ENOSPC, EDQUOT).
func full(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

func (h *Values) runDir(run string) (string, error) {
	if run == "" || run != filepath.Base(run) || strings.HasPrefix(run, ".") {
		return "", fmt.Errorf("%w: run id %q", unit.ErrInvalid, run)
	}
	return filepath.Join(h.dir, run), nil
}

// mounted says whether the tmpfs is mounted at dir: dir is on another
// device than its parent, and that device is a tmpfs.
func (h *Values) mounted() bool {
	var st, parent unix.Stat_t
	if unix.Stat(h.dir, &st) != nil || unix.Stat(filepath.Dir(h.dir), &parent) != nil || st.Dev == parent.Dev {
		return false
	}
	var fs unix.Statfs_t
	return unix.Statfs(h.dir, &fs) == nil && fs.Type == unix.TMPFS_MAGIC
}

// mount mounts the tmpfs at dir unless it is there: nothing is ever
// written to dir's own file system.
func (h *Values) mount() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mounted() {
		return nil
	}
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	if err := unix.Mount("tmpfs", h.dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, tmpfsOptions); err != nil {
		return fmt.Errorf("secrets: mounting a tmpfs at %s: %w", h.dir, err)
	}
	return nil
}
