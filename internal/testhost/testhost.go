// Package testhost is a host for tests that need no root: a real store in
// a temporary directory and a real meter over internal/idle's sysfs- and
// procfs-shaped host tree, with helpers that write runs and objects the
// way the daemon does. Its cleanup verifies every record from genesis.
package testhost

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/txtar"

	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Fixture is a store, a meter, and the root of the meter's host tree, where a
// test rewrites counters.
type Fixture struct {
	Store *store.Store
	Meter *idle.Meter
	Root  string
}

// idleTestdata is internal/idle's testdata directory.
func idleTestdata() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "idle", "testdata")
}

// New opens a store in a temporary directory and a meter on internal/idle's
// host tree with the RAPL case raplCase (no RAPL at all when empty) and
// coefficients c (the defaults when zero). Its cleanup checks that every
// record verifies from genesis, and closes the store.
func New(t testing.TB, raplCase string, c ...idle.Coefficients) *Fixture {
	t.Helper()
	root := t.TempDir()
	extractTree(t, filepath.Join(idleTestdata(), "host.txtar"), root)
	if raplCase != "" {
		extractTree(t, filepath.Join(idleTestdata(), "rapl", raplCase+".txtar"), root)
	} else if err := os.MkdirAll(filepath.Join(root, "sys"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := idle.Config{
		SysfsRoot:  filepath.Join(root, "sys"),
		ProcfsRoot: filepath.Join(root, "proc"),
		CgroupRoot: filepath.Join(root, "cgroup-v2"),
		Cgroup:     idle.CgroupV2,
	}
	if len(c) > 0 {
		cfg.Coefficients = c[0]
	}
	m, err := idle.NewMeter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ids, err := st.AllRuns()
		if err != nil {
			t.Error(err)
		}
		for _, id := range ids {
			if _, err := st.Record(id); err != nil {
				t.Errorf("run %s does not verify: %v", id, err)
			}
		}
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	return &Fixture{Store: st, Meter: m, Root: root}
}

// Log is a logger writing to the test's log.
func Log(t testing.TB) *slog.Logger { return slog.New(slog.NewTextHandler(testLog{t}, nil)) }

type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func extractTree(t testing.TB, archive, root string) {
	t.Helper()
	a, err := txtar.ParseFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range a.Files {
		p := filepath.Join(root, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Rewrite replaces a file in the host tree as sysfs and procfs do: whole.
func (h *Fixture) Rewrite(t testing.TB, name, content string) {
	t.Helper()
	p := filepath.Join(h.Root, filepath.FromSlash(name))
	if err := os.WriteFile(p+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
}

// Put stores b.
func (h *Fixture) Put(t testing.TB, b []byte) record.Address {
	t.Helper()
	a, err := h.Store.PutBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Append appends segs to run id at its head.
func (h *Fixture) Append(t testing.TB, id string, segs ...record.Segment) {
	t.Helper()
	head, err := h.Store.Head(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.AppendAll(id, head, segs...); err != nil {
		t.Fatal(err)
	}
}

// Start creates run id, executing.
func (h *Fixture) Start(t testing.TB, id string) {
	t.Helper()
	if _, err := h.Store.Create(id, h.Put(t, []byte("unit "+id)), h.Put(t, []byte("grants "+id))); err != nil {
		t.Fatal(err)
	}
}

// Park appends an interval and its park to run id, as a park does.
func (h *Fixture) Park(t testing.TB, id string, snap record.Snapshot) {
	t.Helper()
	att := h.Put(t, []byte("attestation of "+id+"'s interval "+time.Now().String()))
	h.Append(t, id, record.Execution(att, nil), record.Suspension(snap, h.Put(t, []byte("manifest "+id))))
}

// TranscriptPark stores size bytes as a transcript and returns its
// snapshot; it retains exactly size bytes.
func (h *Fixture) TranscriptPark(t testing.TB, size int) record.Snapshot {
	t.Helper()
	return record.TranscriptSnapshot(h.Put(t, bytes.Repeat([]byte{'t'}, size)))
}

// DirObject ingests files (name → size) as a directory object and returns
// its address and the bytes it retains: the files and the listing.
func (h *Fixture) DirObject(t testing.TB, files map[string]int) (record.Address, int64) {
	t.Helper()
	dir, err := h.Store.StagingDir("testhost")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for name, size := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte(name[:1]), size), 0o600); err != nil {
			t.Fatal(err)
		}
		n += int64(size)
	}
	a, _, err := h.Store.Ingest(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	listing, err := h.Store.ReadAll(a)
	if err != nil {
		t.Fatal(err)
	}
	return a, n + int64(len(listing))
}
