package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// LockTimeout is how long [Open] waits for another process to release the
// bbolt file before it gives up with [ErrLocked].
const LockTimeout = time.Second

// Store is a host's records and objects. It is safe for concurrent use by
// many goroutines; one process at a time may hold a store open.
type Store struct {
	dir     string
	objects string
	db      *bolt.DB
	queue   chan *commitReq
	done    chan struct{}
	// closeMu orders Close after every send to queue.
	closeMu sync.RWMutex
	closed  bool
	// gc is held shared by everything that names objects after checking
	// they are present (Append, Import, the naming step of Put and
	// Ingest), and exclusively by GC, so no object is removed between the
	// check and the commit.
	gc sync.RWMutex
	// chunking is the image parks' setting (chunked.go).
	chunking chunking
	// observe, when not nil, is told each durability step of
	// [Store.AdoptFiles] as it is done (tests check their order).
	observe func(step, path string)
}

// Open opens the store in dir, creating it if dir holds none, and migrates
// an older schema. A damaged bbolt file, a missing objects directory beside
// an existing bbolt file, or a schema from a newer daemon is an error
// (wrapping [ErrDamaged] or [ErrSchema]), never a panic. A store held open
// by another process is [ErrLocked] after [LockTimeout].
func Open(dir string) (*Store, error) {
	dbPath := filepath.Join(dir, "records.db")
	objects := filepath.Join(dir, "objects")
	dbInfo, dbErr := os.Stat(dbPath)
	switch info, err := os.Stat(objects); {
	case err == nil && !info.IsDir():
		return nil, fmt.Errorf("store %s: %w: objects is not a directory", dir, ErrDamaged)
	case errors.Is(err, fs.ErrNotExist) && dbErr == nil:
		return nil, fmt.Errorf("store %s: %w: records.db exists but objects/ is missing", dir, ErrDamaged)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("store %s: %w", dir, err)
	}
	// bbolt takes an empty file for a new database. A store whose records
	// were emptied must not come back as a new, empty store beside its
	// objects; only a crash during a store's creation leaves an empty file.
	if dbErr == nil && dbInfo.Size() == 0 && hasObjects(objects) {
		return nil, fmt.Errorf("store %s: %w: records.db is empty but objects exist", dir, ErrDamaged)
	}
	if err := os.MkdirAll(filepath.Join(objects, "tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("store %s: %w", dir, err)
	}
	db, err := openBolt(dbPath)
	if err != nil {
		return nil, fmt.Errorf("store %s: records.db: %w", dir, err)
	}
	s := &Store{dir: dir, objects: objects, db: db, queue: make(chan *commitReq, maxBatch), done: make(chan struct{})}
	if err := s.checkLength(dbPath); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.prepareObjects(); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, err
	}
	go s.commitLoop()
	return s, nil
}

// checkLength refuses a bbolt file shorter than the pages its meta page
// counts: a truncated file, whose missing pages bbolt would read through
// its map as faults.
func (s *Store) checkLength(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("store %s: %w", s.dir, err)
	}
	var want int64
	err = s.view(func(tx *bolt.Tx) error { want = tx.Size(); return nil })
	if err == nil && info.Size() < want {
		err = fmt.Errorf("store %s: records.db: %w: %d bytes, its pages need %d", s.dir, ErrDamaged, info.Size(), want)
	}
	return err
}

// prepareObjects runs with the bbolt lock held, so no other process is
// using the store.
func (s *Store) prepareObjects() error {
	// Leftovers of writes and staging a crash interrupted: nothing names them.
	tmp := filepath.Join(s.objects, "tmp")
	leftovers, err := os.ReadDir(tmp)
	if err != nil {
		return fmt.Errorf("store %s: %w: %v", s.dir, ErrDamaged, err)
	}
	for _, l := range leftovers {
		if err := os.RemoveAll(filepath.Join(tmp, l.Name())); err != nil {
			return fmt.Errorf("store %s: clearing tmp: %w", s.dir, err)
		}
	}
	// Every shard directory exists from the start: creating one is a
	// journal commit, which for a tree of small files cost more than
	// hashing it.
	for _, c := range shardChars {
		if err := os.Mkdir(filepath.Join(s.objects, string(c)), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("store %s: %w", s.dir, err)
		}
	}
	// A previous process may have died between renaming an object into
	// place and fsyncing its directory. An object's presence is trusted
	// (a put of the same bytes is skipped), so make every name durable
	// before this process relies on one.
	return syncFS(s.objects)
}

// hasObjects reports whether any shard of objects holds a file.
func hasObjects(objects string) bool {
	for _, c := range shardChars {
		if f, err := os.Open(filepath.Join(objects, string(c))); err == nil {
			names, _ := f.Readdirnames(1)
			f.Close()
			if len(names) > 0 {
				return true
			}
		}
	}
	return false
}

// shardChars are the characters an address's text may start with after
// "b3:": the base64url alphabet.
const shardChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// openBolt opens the bbolt file. bbolt trusts the pages it reads and may
// panic on a damaged file; the panic becomes [ErrDamaged]. A panic inside
// bolt.Open strands bbolt's lock and map of the file in this process (the
// map keeps the locked file open), so a file repaired after such an error
// opens again only in a new process.
func openBolt(path string) (db *bolt.DB, err error) {
	defer recoverDamage(&err)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: LockTimeout, FreelistType: bolt.FreelistMapType})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, ErrLocked
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrDamaged, err)
	}
	return db, nil
}

// Close waits for queued commits, then closes the bbolt file.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return ErrClosed
	}
	s.closed = true
	close(s.queue)
	s.closeMu.Unlock()
	<-s.done
	return s.db.Close()
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// view runs fn in a read transaction. bbolt trusts its pages: on a damaged
// file it may panic or fault reading the map, so both become [ErrDamaged].
func (s *Store) view(fn func(tx *bolt.Tx) error) (err error) {
	defer s.recoverDamage(&err)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return s.db.View(fn)
}

// update runs fn in a write transaction and commits it (fsync), with the
// protection of [Store.view]. Only the commit loop calls it.
func (s *Store) update(fn func(tx *bolt.Tx) error) (err error) {
	defer s.recoverDamage(&err)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return s.db.Update(fn)
}

func recoverDamage(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: bbolt: %v", ErrDamaged, r)
	}
}

func (s *Store) recoverDamage(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("store %s: %w: bbolt: %v", s.dir, ErrDamaged, r)
	}
}
