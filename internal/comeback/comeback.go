// Package comeback keeps, on one host, the runs that were parked for the
// daemon to stop — by the stop itself (serve --on-stop=park) or by
// `runrecordd park --all` — so that the daemon's next start resumes them
// (docs/daemon.md, "Stop and start"). Each entry names the run and the
// head its park left: a run that has moved on since (resumed, closed,
// migrated, parked again by hand) no longer matches, and is left alone.
//
// It is host-local state, never in a bundle nor in the fleet's directory:
// one file, STATE/comeback.json, replaced whole and durably at each change
// (internal/atomicfile). The file is read as this host's own and still
// checked: a file that does not parse is reported and resumes nothing.
package comeback

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// File is the list's name in the state directory.
const File = "comeback.json"

// maxFile bounds the file read back: a few hundred bytes a run.
const maxFile = 16 << 20

// ErrDamaged is a list file that does not parse as one this package wrote.
var ErrDamaged = errors.New("comeback list damaged")

// Entry is one run to resume at the next start, and the head its park
// left.
type Entry struct {
	Run  string         `json:"run"`
	Head record.Address `json:"head"`
}

type file struct {
	Version int     `json:"version"`
	Runs    []Entry `json:"runs"`
}

// List is the state directory's list. Its methods are safe to call at
// once.
type List struct {
	path string
	mu   sync.Mutex
}

// Open is the list in stateDir (made on the first Add).
func Open(stateDir string) *List { return &List{path: filepath.Join(stateDir, File)} }

// Entries are the runs listed, in the order they were added.
func (l *List) Entries() ([]Entry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.read()
}

// Add lists run id at head, replacing an entry of the same run.
func (l *List) Add(id string, head record.Address) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	es, err := l.read()
	if err != nil && !errors.Is(err, ErrDamaged) {
		return err
	}
	es = slices.DeleteFunc(es, func(e Entry) bool { return e.Run == id })
	return l.write(append(es, Entry{Run: id, Head: head}))
}

// Remove drops the runs named; the file goes with the last entry.
func (l *List) Remove(ids ...string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	es, err := l.read()
	if err != nil && !errors.Is(err, ErrDamaged) {
		return err
	}
	es = slices.DeleteFunc(es, func(e Entry) bool { return slices.Contains(ids, e.Run) })
	if len(es) == 0 {
		if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return atomicfile.SyncDir(filepath.Dir(l.path))
	}
	return l.write(es)
}

func (l *List) read() ([]Entry, error) {
	f, err := os.Open(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxFile {
		return nil, fmt.Errorf("%s: %w: over %d bytes", l.path, ErrDamaged, maxFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var v file
	if err := dec.Decode(&v); err != nil || dec.More() {
		return nil, fmt.Errorf("%s: %w: %v", l.path, ErrDamaged, err)
	}
	if v.Version != 1 {
		return nil, fmt.Errorf("%s: %w: version %d", l.path, ErrDamaged, v.Version)
	}
	for _, e := range v.Runs {
		if e.Run == "" || e.Head.IsZero() {
			return nil, fmt.Errorf("%s: %w: an entry without a run or a head", l.path, ErrDamaged)
		}
	}
	return v.Runs, nil
}

func (l *List) write(es []Entry) error {
	b, err := json.MarshalIndent(file{Version: 1, Runs: es}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(l.path, 0o600, func(f *os.File) error {
		_, err := f.Write(append(b, '\n'))
		return err
	})
}
