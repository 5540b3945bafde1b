// Package idmap is a host's user-namespace ranges: disjoint ranges of
// [Size] host ids, each the host side of one sandbox's user namespace
// (its ids 0 up to Size-1), each held by one holder — a run, from its
// sandbox's creation until the run closes or leaves the host, or a warm
// sandbox until the run that claims it takes its range over ([Ranges.Bind]).
//
// A range is host-local state: it is never in a run's record, manifest
// or bundle (the images carry in-namespace ids, and the restore puts
// this host's range into them). Ranges are kept as one file per held
// range under a directory of the host's state directory, DIR/idmap/N,
// where N is the range's index in the window and the file holds its
// holder; a take creates the file (never replacing one), a release
// removes it, each synced before it returns, so a crash never gives one
// range to two holders.
//
// The window is configured ([Config]): Count ranges from Base, aligned
// to Size, which must not overlap the subordinate ids /etc/subuid and
// /etc/subgid give users (Open refuses a window that does).
package idmap

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
)

// Size is the ids of one range: a sandbox maps its ids 0 to Size-1, so
// 65534 (the overflow id) is mapped.
const Size = 1 << 16

// Defaults of the window: ranges from 2^20 up to 2^31, past what
// useradd gives users and their subordinate ids by default (from
// 100000, 65536 each, for the first 14 users), below the ids Linux
// treats as negative.
const (
	DefaultBase  = 1 << 20
	DefaultCount = (1<<31 - DefaultBase) / Size
)

// Subordinate are the files whose ranges the window must not overlap.
var Subordinate = []string{"/etc/subuid", "/etc/subgid"}

var (
	// ErrExhausted: every range of the window is held.
	ErrExhausted = errors.New("idmap: every user-namespace range of this host is held")
	// ErrHolder: a holder that holds no range, or already holds one
	// (Bind), or a name that cannot be one.
	ErrHolder = errors.New("idmap: holder")
	// ErrConfig: a window that is not aligned, overflows or overlaps
	// subordinate ids.
	ErrConfig = errors.New("idmap: window")
	// ErrDamaged: the directory holds a file that is not a range.
	ErrDamaged = errors.New("idmap: damaged state")
)

// Range is a range of host ids: Base up to Base+Size-1.
type Range struct{ Base uint32 }

// Config is a host's window of ranges.
type Config struct {
	// Base is the first host id of the window (DefaultBase when 0);
	// a multiple of Size.
	Base uint32
	// Count is how many ranges the window holds (DefaultCount when 0).
	Count int
	// Subordinate are /etc/subuid-style files (user:first:count) the
	// window must not overlap; the package's Subordinate when nil. A
	// missing file overlaps nothing.
	Subordinate []string
}

// Ranges are a host's ranges, held and free.
type Ranges struct {
	dir   string
	base  uint32
	count int

	mu     sync.Mutex
	byIdx  map[int]string // range index → holder
	holder map[string]int // holder → range index
}

// Open opens the ranges kept in dir (created if absent) for the window
// cfg: leftovers of an interrupted write are removed, every held range
// is read back.
func Open(dir string, cfg Config) (*Ranges, error) {
	if cfg.Base == 0 {
		cfg.Base = DefaultBase
	}
	if cfg.Count == 0 {
		cfg.Count = DefaultCount
	}
	if cfg.Subordinate == nil {
		cfg.Subordinate = Subordinate
	}
	if cfg.Base%Size != 0 || cfg.Count < 0 || uint64(cfg.Base)+uint64(cfg.Count)*Size > 1<<32-1 { // (uid_t)-1 is no id
		return nil, fmt.Errorf("%w: %d ranges of %d ids from %d", ErrConfig, cfg.Count, Size, cfg.Base)
	}
	end := uint64(cfg.Base) + uint64(cfg.Count)*Size
	for _, f := range cfg.Subordinate {
		if err := overlaps(f, uint64(cfg.Base), end); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	r := &Ranges{dir: dir, base: cfg.Base, count: cfg.Count, byIdx: map[int]string{}, holder: map[string]int{}}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, ".") { // atomicfile's temporary names
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, err
			}
			continue
		}
		i, err := strconv.Atoi(name)
		if err != nil || strconv.Itoa(i) != name || !de.Type().IsRegular() {
			return nil, fmt.Errorf("%w: %s is not a range", ErrDamaged, filepath.Join(dir, name))
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		h := string(b)
		if checkHolder(h) != nil {
			return nil, fmt.Errorf("%w: %s holds %q", ErrDamaged, filepath.Join(dir, name), h)
		}
		if j, ok := r.holder[h]; ok {
			return nil, fmt.Errorf("%w: %q holds ranges %d and %d", ErrDamaged, h, j, i)
		}
		// A range past a window made smaller stays held until it is
		// released: its sandbox may still run.
		r.byIdx[i], r.holder[h] = h, i
	}
	return r, nil
}

// overlaps refuses a window [lo, hi) that overlaps a range of the
// subordinate-id file path.
func overlaps(path string, lo, hi uint64) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) != 3 {
			continue // not a range: newuidmap ignores it too
		}
		first, err1 := strconv.ParseUint(parts[1], 10, 32)
		count, err2 := strconv.ParseUint(parts[2], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		if first < hi && first+count > lo {
			return fmt.Errorf("%w: ids %d to %d overlap %s line %d (%s, %d ids from %d)", ErrConfig, lo, hi-1, path, n, parts[0], count, first)
		}
	}
	return sc.Err()
}

// checkHolder refuses a name that cannot be a holder's.
func checkHolder(h string) error {
	if h == "" || len(h) > 255 || strings.ContainsAny(h, "\x00\n") {
		return fmt.Errorf("%w: %q cannot hold a range", ErrHolder, h)
	}
	return nil
}

func (r *Ranges) rangeOf(i int) Range { return Range{Base: r.base + uint32(i)*Size} }

func (r *Ranges) path(i int) string { return filepath.Join(r.dir, strconv.Itoa(i)) }

// Take is the range holder holds, taken now if it holds none: the
// window's first free range, held durably before Take returns.
func (r *Ranges) Take(holder string) (Range, error) {
	if err := checkHolder(holder); err != nil {
		return Range{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := r.holder[holder]; ok {
		return r.rangeOf(i), nil
	}
	for i := range r.count {
		if _, held := r.byIdx[i]; held {
			continue
		}
		err := atomicfile.Create(r.path(i), 0o600, func(f *os.File) error {
			_, err := f.WriteString(holder)
			return err
		})
		if err != nil {
			return Range{}, fmt.Errorf("idmap: take a range: %w", err)
		}
		r.byIdx[i], r.holder[holder] = holder, i
		return r.rangeOf(i), nil
	}
	return Range{}, ErrExhausted
}

// Held is the range holder holds, and whether it holds one.
func (r *Ranges) Held(holder string) (Range, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.holder[holder]
	return r.rangeOf(i), ok
}

// Holders are the holders of every held range.
func (r *Ranges) Holders() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.holder))
	for h := range r.holder {
		out = append(out, h)
	}
	return out
}

// Bind hands the range from holds to to (a warm sandbox's range, to the
// run that claims it). to must hold none.
func (r *Ranges) Bind(from, to string) error {
	if err := checkHolder(to); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.holder[from]
	if !ok {
		return fmt.Errorf("%w: %q holds no range", ErrHolder, from)
	}
	if j, ok := r.holder[to]; ok {
		return fmt.Errorf("%w: %q already holds range %d", ErrHolder, to, j)
	}
	err := atomicfile.Write(r.path(i), 0o600, func(f *os.File) error {
		_, err := f.WriteString(to)
		return err
	})
	if err != nil {
		return fmt.Errorf("idmap: bind a range: %w", err)
	}
	delete(r.holder, from)
	r.byIdx[i], r.holder[to] = to, i
	return nil
}

// Release frees the range holder holds, if any. The caller releases a
// range only once nothing of its sandbox is left.
func (r *Ranges) Release(holder string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.holder[holder]
	if !ok {
		return nil
	}
	if err := os.Remove(r.path(i)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("idmap: release a range: %w", err)
	}
	if err := atomicfile.SyncDir(r.dir); err != nil {
		return fmt.Errorf("idmap: release a range: %w", err)
	}
	delete(r.holder, holder)
	delete(r.byIdx, i)
	return nil
}
