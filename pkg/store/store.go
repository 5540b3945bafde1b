package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the bbolt schema this package writes.
const SchemaVersion = 2

var (
	bktMeta   = []byte("meta")
	bktRuns   = []byte("runs")
	bktPhases = []byte("phases")
	bktRefs   = []byte("refs")
	keyVer    = []byte("version")
	keyState  = []byte("state")
	bktSegs   = []byte("segs")
)

// Store is a host's records and objects. It is safe for concurrent use.
type Store struct {
	dir     string
	objects string
	db      *bolt.DB
	queue   chan *commitReq
	done    chan struct{}
	closeMu sync.Once
}

// Open opens (creating if needed) the store in dir, migrating an older
// schema. A damaged bbolt file is an error wrapping [ErrDamaged], never a
// panic; a store held by another process is an error after a second.
func Open(dir string) (s *Store, err error) {
	objects := filepath.Join(dir, "objects")
	if err := os.MkdirAll(filepath.Join(objects, "tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// Leftovers of writes a crash interrupted: never named by anything.
	if tmps, err := os.ReadDir(filepath.Join(objects, "tmp")); err == nil {
		for _, t := range tmps {
			os.RemoveAll(filepath.Join(objects, "tmp", t.Name()))
		}
	}
	path := filepath.Join(dir, "records.db")
	db, err := openBolt(path)
	if err != nil {
		return nil, err
	}
	s = &Store{dir: dir, objects: objects, db: db, queue: make(chan *commitReq, 1024), done: make(chan struct{})}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, err
	}
	go s.commitLoop()
	return s, nil
}

func openBolt(path string) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("store: %s: %w: %v", path, ErrDamaged, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("store: %s is in use by another process", path)
		}
		return nil, fmt.Errorf("store: %s: %w: %v", path, ErrDamaged, err)
	}
	return db, nil
}

// Close stops the commit queue and closes the bbolt file.
func (s *Store) Close() error {
	var err error
	s.closeMu.Do(func() {
		close(s.queue)
		<-s.done
		err = s.db.Close()
	})
	return err
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// view runs fn in a read transaction, turning a panic from a damaged page
// into an error.
func (s *Store) view(fn func(tx *bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("store: %w: %v", ErrDamaged, r)
		}
	}()
	return s.db.View(fn)
}

// migration takes the schema from version i+1 to i+2 (migrations[0] is 1→2).
type migration func(tx *bolt.Tx) error

var migrations = []migration{
	migratePhaseIndex, // 1 → 2
}

func (s *Store) migrate() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("store: %w: %v", ErrDamaged, r)
		}
	}()
	return s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bktMeta)
		if err != nil {
			return err
		}
		ver := uint32(0)
		if v := meta.Get(keyVer); v != nil {
			if len(v) != 4 {
				return fmt.Errorf("store: %w: schema version is %d bytes", ErrDamaged, len(v))
			}
			ver = binary.BigEndian.Uint32(v)
		}
		if ver == 0 { // a new store: create the current schema
			for _, b := range [][]byte{bktRuns, bktPhases, bktRefs} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			if err := createPhaseBuckets(tx); err != nil {
				return err
			}
			return meta.Put(keyVer, binary.BigEndian.AppendUint32(nil, SchemaVersion))
		}
		if ver > SchemaVersion {
			return fmt.Errorf("store: %w: version %d is newer than this daemon's %d", ErrSchema, ver, SchemaVersion)
		}
		for ; ver < SchemaVersion; ver++ {
			if err := migrations[ver-1](tx); err != nil {
				return fmt.Errorf("store: migration %d→%d: %w", ver, ver+1, err)
			}
		}
		return meta.Put(keyVer, binary.BigEndian.AppendUint32(nil, SchemaVersion))
	})
}

func createPhaseBuckets(tx *bolt.Tx) error {
	p, err := tx.CreateBucketIfNotExists(bktPhases)
	if err != nil {
		return err
	}
	for _, name := range phaseNames {
		if _, err := p.CreateBucketIfNotExists([]byte(name)); err != nil {
			return err
		}
	}
	return nil
}

// migratePhaseIndex builds phases/ from every run's state.
func migratePhaseIndex(tx *bolt.Tx) error {
	if err := createPhaseBuckets(tx); err != nil {
		return err
	}
	runs := tx.Bucket(bktRuns)
	if runs == nil {
		return fmt.Errorf("%w: no runs bucket", ErrDamaged)
	}
	return runs.ForEachBucket(func(id []byte) error {
		st, err := decodeState(runs.Bucket(id).Get(keyState))
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		return setPhase(tx, string(id), st.phase, st.phase)
	})
}
