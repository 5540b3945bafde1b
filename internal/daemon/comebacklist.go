// The comeback list keeps, on one host, the runs that were parked for the
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

package daemon

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
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// comebackFile is the list's name in the state directory.
const comebackFile = "comeback.json"

// maxComebackFile bounds the file read back: a few hundred bytes a run.
const maxComebackFile = 16 << 20

// errComebackDamaged is a list file that does not parse as one the daemon
// wrote.
var errComebackDamaged = errors.New("comeback list damaged")

// comebackEntry is one run to resume at the next start, and the head its park
// left.
type comebackEntry struct {
	Run  string         `json:"run"`
	Head record.Address `json:"head"`
}

type comebackDoc struct {
	Version int             `json:"version"`
	Runs    []comebackEntry `json:"runs"`
}

// comebackList is the state directory's list. Its methods are safe to call at
// once.
type comebackList struct {
	path string
	mu   sync.Mutex
}

// openComeback is the list in stateDir (made on the first Add).
func openComeback(stateDir string) *comebackList {
	return &comebackList{path: filepath.Join(stateDir, comebackFile)}
}

// Entries are the runs listed, in the order they were added.
func (l *comebackList) Entries() ([]comebackEntry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.read()
}

// Add lists run id at head, replacing an entry of the same run.
func (l *comebackList) Add(id string, head record.Address) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	es, err := l.read()
	if err != nil && !errors.Is(err, errComebackDamaged) {
		return err
	}
	es = slices.DeleteFunc(es, func(e comebackEntry) bool { return e.Run == id })
	return l.write(append(es, comebackEntry{Run: id, Head: head}))
}

// AddHead lists parked run id at its head in st now, for the next start
// to resume. The caller holds the run's lock.
func (l *comebackList) AddHead(st *store.Store, id string) error {
	head, err := st.Head(id)
	if err == nil {
		err = l.Add(id, head)
	}
	if err != nil {
		return fmt.Errorf("run %s parked, but not listed for the next start to resume: %w", id, err)
	}
	return nil
}

// Remove drops the runs named; the file goes with the last entry.
func (l *comebackList) Remove(ids ...string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	es, err := l.read()
	if err != nil && !errors.Is(err, errComebackDamaged) {
		return err
	}
	es = slices.DeleteFunc(es, func(e comebackEntry) bool { return slices.Contains(ids, e.Run) })
	if len(es) == 0 {
		if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return atomicfile.SyncDir(filepath.Dir(l.path))
	}
	return l.write(es)
}

func (l *comebackList) read() ([]comebackEntry, error) {
	f, err := os.Open(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxComebackFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxComebackFile {
		return nil, fmt.Errorf("%s: %w: over %d bytes", l.path, errComebackDamaged, maxComebackFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var v comebackDoc
	if err := dec.Decode(&v); err != nil || dec.More() {
		return nil, fmt.Errorf("%s: %w: %v", l.path, errComebackDamaged, err)
	}
	if v.Version != 1 {
		return nil, fmt.Errorf("%s: %w: version %d", l.path, errComebackDamaged, v.Version)
	}
	for _, e := range v.Runs {
		if e.Run == "" || e.Head.IsZero() {
			return nil, fmt.Errorf("%s: %w: an entry without a run or a head", l.path, errComebackDamaged)
		}
	}
	return v.Runs, nil
}

func (l *comebackList) write(es []comebackEntry) error {
	b, err := json.MarshalIndent(comebackDoc{Version: 1, Runs: es}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(l.path, 0o600, func(f *os.File) error {
		_, err := f.Write(append(b, '\n'))
		return err
	})
}
