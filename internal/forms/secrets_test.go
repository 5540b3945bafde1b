package forms

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A run that names secrets has its directory of them mounted read-only
// (Own) at secrets.Target in each of its sandboxes, of both forms; one
// that names none has no such mount; without a host to keep them the
// sandbox is not made.
func TestSecretsMounted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the secrets tmpfs needs root (CI runs as root)")
	}
	h, box := testHost(t, nil)
	none := h
	h.Secrets = secrets.New(h.StateDir)
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(h.StateDir, "secrets"), unix.MNT_DETACH) })
	mount := func(spec executor.Spec) *executor.Mount {
		for _, m := range spec.Mounts {
			if m.Target == secrets.Target {
				return &m
			}
		}
		return nil
	}
	want := filepath.Join(h.StateDir, "secrets", "r")

	tr := transcriptRun("r")
	tr.Grants.Secrets = []string{"K"}
	w, err := h.For(unit.TranscriptMode).Start(t.Context(), stored(t, h, tr))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Unit.Close()
	if m := mount(box.started["r_t1"]); m == nil || m.Source != want || !m.Own || m.Writable {
		t.Fatalf("a transcript sandbox's secrets mount %+v", m)
	}

	ir := imageRun("s")
	ir.Grants.Secrets = []string{"K"}
	if _, err := h.For(unit.ImageMode).Start(t.Context(), ir); err != nil {
		t.Fatal(err)
	}
	if m := mount(box.started["s"]); m == nil || m.Source != filepath.Join(h.StateDir, "secrets", "s") {
		t.Fatalf("an image sandbox's secrets mount %+v", m)
	}

	if _, err := h.For(unit.ImageMode).Start(t.Context(), imageRun("u")); err != nil {
		t.Fatal(err)
	}
	if m := mount(box.started["u"]); m != nil {
		t.Fatalf("a run naming no secret has a secrets mount %+v", m)
	}

	if _, err := none.For(unit.ImageMode).Start(t.Context(), ir); !errors.Is(err, secrets.ErrRequired) {
		t.Fatalf("without a host for secrets: %v", err)
	}
}
