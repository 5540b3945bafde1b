package daemon

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

const secretValue = "sk-test-6d1f0c2b9a"

// mustSecretsHost is a fake host whose secrets tmpfs is unmounted when
// the test ends.
func mustSecretsHost(t *testing.T) *fakeHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the secrets tmpfs needs root (CI runs as root)")
	}
	h := newFakeHost(t)
	dir := filepath.Join(h.d.cfg.StateDir, "secrets")
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return h
}

// A run's secrets: the names in its grant set, the values in each
// sandbox's mount only; a resume without values the host lost is
// refused and changes nothing, one that gives them goes on; a close
// removes them.
func TestSecretsWalk(t *testing.T) {
	h := mustSecretsHost(t)
	vals := map[string]string{"API_KEY": secretValue, "b.tok": "two"}
	s, err := h.d.StartBooked(t.Context(), "r", unit.Spec{Image: fakeImage, Args: []string{"/unit"}}, unit.Grants{}, answers.Starting{Secrets: vals})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := h.d.st.Run("r")
	_, g, err := h.d.st.ReadRun(st)
	if err != nil || !slices.Equal(g.Secrets, []string{"API_KEY", "b.tok"}) {
		t.Fatalf("grant set's secrets %q (%v)", g.Secrets, err)
	}
	if s.Grants.String() != mustGrantsID(t, g) {
		t.Fatalf("grants id %s", s.Grants)
	}
	dir := filepath.Join(h.d.cfg.StateDir, "secrets", "r")
	if m := lastMount(h.ex, secrets.Target); m == nil || m.Source != dir || !m.Own || m.Writable {
		t.Fatalf("the sandbox's secrets mount: %+v", m)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "API_KEY")); err != nil || string(b) != secretValue {
		t.Fatalf("API_KEY on the tmpfs: %q %v", b, err)
	}
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	// Held here: a resume needs nothing.
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatal(err)
	}
	if m := lastMount(h.ex, secrets.Target); m == nil || m.Source != dir {
		t.Fatalf("the restore's secrets mount: %+v", m)
	}
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	// The tmpfs gone, as after a reboot.
	if err := unix.Unmount(filepath.Dir(dir), 0); err != nil {
		t.Fatal(err)
	}
	if st, _ = h.d.st.Run("r"); st.Phase != record.PhaseParked {
		t.Fatal(st.Phase)
	}
	head := st.Head
	_, err = h.d.Resume(t.Context(), "r", nil)
	if !errors.Is(err, secrets.ErrRequired) || !strings.Contains(err.Error(), "API_KEY, b.tok") {
		t.Fatalf("resume without the values: %v", err)
	}
	_, err = h.d.Resume(t.Context(), "r", map[string]string{"API_KEY": secretValue})
	if !errors.Is(err, secrets.ErrRequired) || strings.Contains(err.Error(), secretValue) {
		t.Fatalf("resume with a value missing: %v", err)
	}
	_, err = h.d.Resume(t.Context(), "r", map[string]string{"API_KEY": secretValue, "b.tok": "2", "OTHER": "x"})
	if !errors.Is(err, unit.ErrInvalid) {
		t.Fatalf("resume with a value the run does not name: %v", err)
	}
	if st, _ := h.d.st.Run("r"); st.Phase != record.PhaseParked || st.Head != head {
		t.Fatalf("a refused resume moved the run: %s %s", st.Phase, st.Head)
	}
	if _, err := h.d.Resume(t.Context(), "r", map[string]string{"API_KEY": "rotated", "b.tok": "2"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "API_KEY")); err != nil || string(b) != "rotated" {
		t.Fatalf("API_KEY after the resume that gave it: %q %v", b, err)
	}
	if _, err := h.d.Close(t.Context(), "r", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the values outlived the close: %v", err)
	}
	// No value anywhere in the state directory but the tmpfs (gone now).
	_ = filepath.WalkDir(h.d.cfg.StateDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(secretValue)) || bytes.Contains(b, []byte("rotated")) {
			t.Errorf("%s holds a secret's value", p)
		}
		return nil
	})
}

// A start refused keeps no value; a start whose grant set names a
// secret without its value is refused with ErrRequired.
func TestSecretsStartRefused(t *testing.T) {
	h := mustSecretsHost(t)
	spec := unit.Spec{Image: fakeImage, Args: []string{"/unit"}}
	_, err := h.d.StartBooked(t.Context(), "a", spec, unit.Grants{Secrets: []string{"K"}}, answers.Starting{})
	if !errors.Is(err, secrets.ErrRequired) {
		t.Fatalf("a named secret without its value: %v", err)
	}
	_, err = h.d.StartBooked(t.Context(), "a", spec, unit.Grants{}, answers.Starting{Secrets: map[string]string{"../x": "v"}})
	if !errors.Is(err, unit.ErrInvalid) {
		t.Fatalf("a bad name: %v", err)
	}
	h.ex.startErr = executor.ErrInvalid
	_, err = h.d.StartBooked(t.Context(), "b", spec, unit.Grants{}, answers.Starting{Secrets: map[string]string{"K": "v"}})
	if !errors.Is(err, executor.ErrInvalid) {
		t.Fatalf("start: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.d.cfg.StateDir, "secrets", "b")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused start's values stay: %v", err)
	}
}

// A start or resume whose values the secrets tmpfs has no room for is
// refused secrets.ErrNoSpace and loses nothing: no run, or the run
// parked as it was with the values it held.
func TestSecretsNoSpace(t *testing.T) {
	h := mustSecretsHost(t)
	dir := filepath.Join(h.d.cfg.StateDir, "secrets")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// 16 pages stand for the full 256 MiB.
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0700,size=64k"); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", secrets.MaxValue)
	spec := unit.Spec{Image: fakeImage, Args: []string{"/unit"}}
	_, err := h.d.StartBooked(t.Context(), "full", spec, unit.Grants{}, answers.Starting{Secrets: map[string]string{"A": big, "B": big}})
	if !errors.Is(err, secrets.ErrNoSpace) {
		t.Fatalf("a start the tmpfs has no room for: %v", err)
	}
	if _, err := h.d.st.Run("full"); err == nil {
		t.Fatal("a start refused no_space made a run")
	}
	if _, err := os.Stat(filepath.Join(dir, "full")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused start's values stay: %v", err)
	}
	if _, err := h.d.StartBooked(t.Context(), "r", spec, unit.Grants{}, answers.Starting{Secrets: map[string]string{"A": "one", "B": "two"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	st, _ := h.d.st.Run("r")
	_, err = h.d.Resume(t.Context(), "r", map[string]string{"A": big, "B": big})
	if !errors.Is(err, secrets.ErrNoSpace) {
		t.Fatalf("a resume the tmpfs has no room for: %v", err)
	}
	if now, _ := h.d.st.Run("r"); now.Phase != record.PhaseParked || now.Head != st.Head {
		t.Fatalf("a resume refused no_space moved the run: %s %s", now.Phase, now.Head)
	}
	es, _ := os.ReadDir(filepath.Join(dir, "r"))
	if len(es) != 2 {
		t.Fatalf("after the refused resume the run's directory holds %d files", len(es))
	}
	if _, err := h.d.Resume(t.Context(), "r", nil); err != nil {
		t.Fatalf("a resume with the values held: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "r", "A")); err != nil || string(b) != "one" {
		t.Fatalf("A after the refused resume: %q %v", b, err)
	}
}

func lastMount(x *fakeExec, target string) *executor.Mount {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.specs) == 0 {
		return nil
	}
	for _, m := range x.specs[len(x.specs)-1].Mounts {
		if m.Target == target {
			return &m
		}
	}
	return nil
}

func mustGrantsID(t *testing.T, g unit.Grants) string {
	t.Helper()
	id, err := g.ID()
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// A start's sweep removes the values of runs that no longer need them
// here (unknown, closed) and keeps a parked run's.
func TestSecretsSwept(t *testing.T) {
	h := mustSecretsHost(t)
	spec := unit.Spec{Image: fakeImage, Args: []string{"/unit"}}
	for _, id := range []string{"parked", "closed"} {
		if _, err := h.d.StartBooked(t.Context(), id, spec, unit.Grants{}, answers.Starting{Secrets: map[string]string{"K": "v"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.d.Park(t.Context(), "parked"); err != nil {
		t.Fatal(err)
	}
	// A close that could not remove them (its daemon died first).
	if _, err := h.d.Close(t.Context(), "closed", ""); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"closed", "ghost"} {
		if err := h.d.secrets.Put(id, map[string]string{"K": "v"}); err != nil {
			t.Fatal(err)
		}
	}
	sweepSecrets(h.d.secrets, h.d.st, h.d.log)
	runs, err := h.d.secrets.Runs()
	if err != nil || !slices.Equal(runs, []string{"parked"}) {
		t.Fatalf("after the sweep the values of %q are held (%v)", runs, err)
	}
}

// A run handed to another host (here an export with handoff; a
// migration out goes the same way) leaves no value here: the host that
// holds it now asks for them.
func TestSecretsHandedOff(t *testing.T) {
	h := mustSecretsHost(t)
	vals := map[string]string{"API_KEY": secretValue}
	if _, err := h.d.StartBooked(t.Context(), "r", unit.Spec{Image: fakeImage, Args: []string{"/unit"}}, unit.Grants{}, answers.Starting{Secrets: vals}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Park(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.teardown(t, "r")
	dir := filepath.Join(h.d.cfg.StateDir, "secrets", "r")
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the parked run's values: %v", err)
	}
	var b bytes.Buffer
	if err := h.d.exporter.Export(t.Context(), "r", &b, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the values outlived the handoff: %v", err)
	}
}
