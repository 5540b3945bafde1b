package forms

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// fakeLinks records what the forms ask of the host's links.
type fakeLinks struct {
	mu    sync.Mutex
	calls []string
}

func (l *fakeLinks) Link(run string, allow []unit.Dest, restore bool) (func(string) error, error) {
	how := ""
	if restore {
		how = " restore"
	}
	return func(netns string) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls = append(l.calls, "link "+run+" "+netns+" "+allow[0].String()+how)
		return nil
	}, nil
}

func (l *fakeLinks) Unlink(run string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, "unlink "+run)
	return nil
}

func (l *fakeLinks) Pass(run string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, "pass "+run)
	return nil
}

func (l *fakeLinks) ResolvConf() (string, error) { return "/state/resolv.conf", nil }

func (l *fakeLinks) took() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.calls
	l.calls = nil
	return out
}

// An image unit granted egress gets its link in its sandbox's spec; a
// park removes it before the checkpoint, and a park refused (at the
// checkpoint, or after it: Thaw) links the unit's namespace again; a
// resume links the restored namespace as a restore's, and leaves its
// pass to the daemon (internal/daemon's resume). A transcript unit granted egress, and a unit on a host without links, are
// refused (ErrNoEgress).
func TestImageEgressLinks(t *testing.T) {
	h, box := testHost(t, nil)
	links := &fakeLinks{}
	h.Links = links
	r := imageRun("r")
	r.Grants = unit.Grants{Network: unit.Egress, Egress: []unit.Dest{{CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"}}}
	f := h.For(unit.ImageMode)
	w, err := f.Start(t.Context(), stored(t, h, r))
	if err != nil {
		t.Fatal(err)
	}
	spec := box.started["r"]
	if spec.Network != unit.Egress || spec.Link == nil {
		t.Fatalf("the sandbox's spec: network %s, link set %v", spec.Network, spec.Link != nil)
	}
	resolv := executor.Mount{Source: "/state/resolv.conf", Target: "/etc/resolv.conf", Own: true}
	if slices.Contains(spec.Mounts, resolv) {
		t.Fatalf("the sandbox's mounts %+v: a grant naming no destination has no %+v", spec.Mounts, resolv)
	}
	if err := spec.Link("/pin"); err != nil {
		t.Fatal(err)
	}
	if got := links.took(); !slices.Equal(got, []string{"link r /pin 203.0.113.0/24:443/tcp"}) {
		t.Fatalf("start: %q", got)
	}
	box.checkpointErr = errors.New("dump refused")
	if _, err := f.Snapshot(t.Context(), w.Unit); err == nil {
		t.Fatal("a refused checkpoint was taken")
	}
	if got := links.took(); !slices.Equal(got, []string{"unlink r", "link r /proc/1/ns/net 203.0.113.0/24:443/tcp", "pass r"}) {
		t.Fatalf("a refused checkpoint: %q", got)
	}
	box.checkpointErr = nil
	if _, err := f.Snapshot(t.Context(), w.Unit); err != nil {
		t.Fatal(err)
	}
	if got := links.took(); !slices.Equal(got, []string{"unlink r"}) {
		t.Fatalf("a snapshot: %q", got)
	}
	if err := f.Thaw(t.Context(), w.Unit); err != nil {
		t.Fatal(err)
	}
	if got := links.took(); !slices.Equal(got, []string{"link r /proc/1/ns/net 203.0.113.0/24:443/tcp", "pass r"}) {
		t.Fatalf("a thaw: %q", got)
	}
	// A restore (here, or on another host) links the restored namespace
	// as a restore's, held: not passed.
	taken, err := f.Snapshot(t.Context(), w.Unit)
	if err != nil {
		t.Fatal(err)
	}
	links.took()
	teardown := make(chan struct{})
	close(teardown)
	_, err = f.Wake(t.Context(), r, Waking{Snapshot: taken.Snapshot, Retained: taken.Retained, Teardown: teardown})
	if err != nil {
		t.Fatal(err)
	}
	if len(box.restoreSpecs) != 1 || slices.Contains(box.restoreSpecs[0].Mounts, resolv) || box.restoreSpecs[0].Link == nil {
		t.Fatalf("the restore's specs %+v, want one with a link and no %+v", box.restoreSpecs, resolv)
	}
	if got := links.took(); !slices.Equal(got, []string{"link r /restored 203.0.113.0/24:443/tcp restore"}) {
		t.Fatalf("a restore: %q", got)
	}
	tr := transcriptRun("t")
	tr.Grants = r.Grants
	if _, err := h.For(unit.TranscriptMode).Start(t.Context(), stored(t, h, tr)); !errors.Is(err, ErrNoEgress) {
		t.Fatalf("a transcript unit granted egress: %v, want ErrNoEgress", err)
	}
	if got := links.took(); len(got) != 0 {
		t.Fatalf("a transcript unit granted egress: %q", got)
	}
	h.Links = nil
	r.ID = "r2"
	if _, err := h.For(unit.ImageMode).Start(t.Context(), stored(t, h, r)); !errors.Is(err, ErrNoEgress) {
		t.Fatalf("a host without links: %v, want ErrNoEgress", err)
	}
}

// A grant naming a destination binds the daemon's resolv.conf at the
// start and again at every restore, so the checkpoint's bind mount finds
// its source on any host.
func TestImageEgressNamesResolv(t *testing.T) {
	h, box := testHost(t, nil)
	h.Links = &fakeLinks{}
	r := imageRun("r")
	r.Grants = unit.Grants{Network: unit.Egress, Egress: []unit.Dest{{Name: "pypi.org", Proto: "tcp", Ports: "443"}}}
	f := h.For(unit.ImageMode)
	w, err := f.Start(t.Context(), stored(t, h, r))
	if err != nil {
		t.Fatal(err)
	}
	resolv := executor.Mount{Source: "/state/resolv.conf", Target: "/etc/resolv.conf", Own: true}
	if !slices.Contains(box.started["r"].Mounts, resolv) {
		t.Fatalf("the sandbox's mounts %+v, want %+v", box.started["r"].Mounts, resolv)
	}
	taken, err := f.Snapshot(t.Context(), w.Unit)
	if err != nil {
		t.Fatal(err)
	}
	teardown := make(chan struct{})
	close(teardown)
	if _, err := f.Wake(t.Context(), r, Waking{Snapshot: taken.Snapshot, Retained: taken.Retained, Teardown: teardown}); err != nil {
		t.Fatal(err)
	}
	if len(box.restoreSpecs) != 1 || !slices.Contains(box.restoreSpecs[0].Mounts, resolv) {
		t.Fatalf("the restore's specs %+v, want one with %+v", box.restoreSpecs, resolv)
	}
}
