package interval

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/attest"
)

// Mark is where an interval begins: its time and the unit's output sizes,
// taken before the sandbox starts so that nothing it writes falls between
// two journals; once metering began, the cgroup's CPU time; and the
// lifecycle entries so far. The daemon keeps it on disk while the interval
// is open, so that a daemon restarted in the middle of an interval attests
// it from its real start. The JSON form is that file's.
type Mark struct {
	StartNS int64          `json:"start_ns"`
	OutOff  int64          `json:"stdout_offset"`
	ErrOff  int64          `json:"stderr_offset"`
	CPUNS   uint64         `json:"cpu_ns"`
	Metered bool           `json:"metered"`
	Events  []attest.Entry `json:"events"`
	// Discarded is what the sandbox had discarded of stdout and stderr
	// when the interval began: zero for a new sandbox's first interval,
	// which holds all it discarded.
	Discarded [2]uint64 `json:"discarded,omitzero"`
	// Traffic is the run's egress counters when the interval began; nil
	// when it held no egress link here then (its counters start at zero).
	Traffic *Counters `json:"traffic,omitempty"`
}

// Output names a unit's output files on this host.
type Output struct{ Stdout, Stderr string }

// MarkAt is a mark at startNS for out: its files' sizes now (a missing
// file is empty).
func MarkAt(startNS int64, out Output) Mark {
	return Mark{StartNS: startNS, OutOff: fileSize(out.Stdout), ErrOff: fileSize(out.Stderr)}
}

func fileSize(p string) int64 {
	if p == "" {
		return 0
	}
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

// SaveMark writes m to path. It is renamed into place but not fsynced:
// the mark serves a daemon restarted after a crash of its own process (the
// page cache keeps it); after a power loss the unit is gone with it.
func SaveMark(path string, m Mark) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return replaceFile(path, b, false)
}

// LoadMark reads the mark saved at path; false when there is none or it
// does not parse.
func LoadMark(path string) (Mark, bool) {
	var m Mark
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &m) != nil {
		return Mark{}, false
	}
	return m, true
}

// DropMark removes the mark at path.
func DropMark(path string) { os.Remove(path) }

// replaceFile writes b whole to path (internal/atomicfile), making its
// directory; durable syncs the file and the directory.
func replaceFile(path string, b []byte, durable bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	write := func(f *os.File) error {
		_, err := f.Write(b)
		return err
	}
	if durable {
		return atomicfile.Write(path, 0o600, write)
	}
	return atomicfile.WriteNoSync(path, 0o600, write)
}

// Offsets is where iv's output begins in its run's output files: the
// bytes before them belong to earlier intervals.
func (iv *Interval) Offsets() (stdout, stderr int64) { return iv.outOff, iv.errOff }

// Files are iv's run's output files on this host.
func (iv *Interval) Files() Output { return iv.out }
