package store

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// mustStore opens a store in a temporary directory; see [mustOpen].
func mustStore(t testing.TB) *Store { return mustOpen(t, t.TempDir()) }

// mustOpen opens the store in dir. When the test ends, if the store is
// still open, it runs [Store.Check] — every record verifies from genesis,
// the phase index agrees, every reachable object matches its address —
// and closes it.
func mustOpen(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.closeMu.RLock()
		closed := s.closed
		s.closeMu.RUnlock()
		if closed {
			return
		}
		if _, err := s.Check(context.Background()); err != nil {
			t.Errorf("cleanup check: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// mustReopen closes s and opens its directory again.
func mustReopen(t testing.TB, s *Store) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return mustOpen(t, s.Dir())
}

func put(t testing.TB, s *Store, content string, refs ...record.Address) record.Address {
	t.Helper()
	a, err := s.PutBytes([]byte(content), refs...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func unitOf(run string) (unit, grants record.Address) {
	return record.Sum([]byte("unit " + run)), record.Sum([]byte("grants"))
}

func mustCreate(t testing.TB, s *Store, run string) record.Address {
	t.Helper()
	u, g := unitOf(run)
	h, err := s.Create(run, u, g)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func mustAppend(t testing.TB, s *Store, run string, head record.Address, seg record.Segment) record.Address {
	t.Helper()
	h, err := s.Append(run, head, seg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// damage rewrites a stored object's file (objects are read-only).
func damage(t testing.TB, s *Store, a record.Address, edit func([]byte) []byte) {
	t.Helper()
	p := s.Path(a)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, edit(b), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o400); err != nil {
		t.Fatal(err)
	}
}

func flipByte(i int) func([]byte) []byte {
	return func(b []byte) []byte { b[i] ^= 0x01; return b }
}

func chtimes(p string, t time.Time) error { return os.Chtimes(p, t, t) }

// segmentSeq returns the log sequence number of a run's segment i.
func segmentSeq(t testing.TB, tx *bolt.Tx, run string, i uint64) uint64 {
	t.Helper()
	st, err := getState(tx, run)
	if err != nil {
		t.Fatal(err)
	}
	seq := st.last
	for j := st.n - 1; j > i; j-- {
		e, err := logAt(tx, run, seq, j)
		if err != nil {
			t.Fatal(err)
		}
		seq = e.prev
	}
	return seq
}

// editSegment edits the stored bytes of a run's segment i in place — the
// head after it, then its canonical bytes — and returns a function that
// puts the original back.
func editSegment(t testing.TB, s *Store, run string, i uint64, edit func(v []byte) []byte) (restore func()) {
	t.Helper()
	var seq uint64
	var orig []byte
	err := s.commit(func(tx *bolt.Tx) error {
		seq = segmentSeq(t, tx, run, i)
		log := tx.Bucket(bktLog)
		orig = slices.Clone(log.Get(seqKey(seq)))
		prefix := 1 + int(orig[0]) + 16
		v := append(slices.Clone(orig[:prefix]), edit(slices.Clone(orig[prefix:]))...)
		return log.Put(seqKey(seq), v)
	})
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := s.commit(func(tx *bolt.Tx) error { return tx.Bucket(bktLog).Put(seqKey(seq), orig) }); err != nil {
			t.Fatal(err)
		}
	}
}

// logLen returns the number of entries in the segment log.
func (s *Store) logLen() (int, error) {
	var n int
	err := s.view(func(tx *bolt.Tx) error {
		n = tx.Bucket(bktLog).Stats().KeyN
		return nil
	})
	return n, err
}
