package drain

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

func host(n string) record.Address { return record.Sum([]byte(n)) }

// hosts are hosts with the same ample room, taking anything.
func hosts(keys ...record.Address) []Target {
	var out []Target
	for _, k := range keys {
		out = append(out, Target{Key: k, Free: 1 << 40})
	}
	return out
}

// Transcript runs go first; runs spread over the hosts; a host that
// refuses a run passes it to the next; a run every host refuses stays,
// with every refusal; progress counts each outcome once.
func TestDrain(t *testing.T) {
	a, b := host("a"), host("b")
	refused := errors.New("manifest mismatch")
	var mu sync.Mutex
	var moved []string
	migrate := func(_ context.Context, id string, to record.Address) error {
		if id == "img-stuck" || (id == "img-b-only" && to == a) {
			return fmt.Errorf("%s to %s: %w", id, to, refused)
		}
		mu.Lock()
		moved = append(moved, id)
		mu.Unlock()
		return nil
	}
	var seen atomic.Int32
	runs := []Run{{ID: "img-1"}, {ID: "tr-1", Transcript: true}, {ID: "img-b-only"}, {ID: "tr-2", Transcript: true}, {ID: "img-stuck"}}
	out := Drain(t.Context(), runs, hosts(a, b), Options{Parallel: 1, Migrate: migrate, Progress: func(o Outcome, done, total int) {
		if total != len(runs) || int(seen.Add(1)) != done {
			t.Errorf("progress %d/%d after %d outcomes", done, total, seen.Load())
		}
	}})
	if got := fmt.Sprint(moved[:2]); got != "[tr-1 tr-2]" {
		t.Fatalf("moved first %s, want the transcript runs", got)
	}
	byRun := map[string]Outcome{}
	for _, o := range out {
		byRun[o.Run] = o
	}
	if byRun["tr-1"].To != a || byRun["tr-2"].To != b {
		t.Fatalf("not spread: %+v", out)
	}
	if o := byRun["img-b-only"]; o.To != b || o.Err != nil {
		t.Fatalf("a run one host refuses: %+v", o)
	}
	if o := byRun["img-stuck"]; !o.To.IsZero() || !errors.Is(o.Err, refused) {
		t.Fatalf("a run every host refuses: %+v", o)
	}
	if seen.Load() != int32(len(runs)) {
		t.Fatalf("%d outcomes told, want %d", seen.Load(), len(runs))
	}
}

// At most parallel runs move at once.
func TestDrainParallel(t *testing.T) {
	var now, most atomic.Int32
	release := make(chan struct{})
	migrate := func(context.Context, string, record.Address) error {
		n := now.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		now.Add(-1)
		return nil
	}
	runs := make([]Run, 6)
	for i := range runs {
		runs[i] = Run{ID: fmt.Sprint(i)}
	}
	done := make(chan []Outcome)
	go func() { done <- Drain(t.Context(), runs, hosts(host("a")), Options{Parallel: 2, Migrate: migrate}) }()
	for range runs {
		release <- struct{}{}
	}
	out := <-done
	if most.Load() > 2 || len(out) != len(runs) {
		t.Fatalf("%d at once, %d outcomes", most.Load(), len(out))
	}
}

// With no host to offer it to, a run stays, saying so.
func TestDrainNoHost(t *testing.T) {
	out := Drain(t.Context(), []Run{{ID: "r"}}, nil, Options{Parallel: 2, Migrate: func(context.Context, string, record.Address) error {
		t.Fatal("migrated with no host")
		return nil
	}})
	if len(out) != 1 || out[0].Err == nil {
		t.Fatalf("%+v", out)
	}
}

// Placement: a run goes only to a host whose manifest matches it and that
// has room for it, the one with the most room left first; a host that did
// not answer gets nothing; a run no host can take stays, with each host's
// reason, and nothing is offered to a host that cannot take it.
func TestDrainPlacement(t *testing.T) {
	a, b, c := host("a"), host("b"), host("c")
	mismatch := errors.New("manifest: cpu_features differ")
	unreachable := errors.New("connection refused")
	hs := []Target{
		{Key: a, Free: 100, Refuses: map[string]error{"img-1": mismatch}},
		{Key: b, Free: 60},
		{Key: c, Err: unreachable},
	}
	var mu sync.Mutex
	offered := map[string][]record.Address{}
	migrate := func(_ context.Context, id string, to record.Address) error {
		mu.Lock()
		defer mu.Unlock()
		offered[id] = append(offered[id], to)
		if to == c {
			t.Errorf("offered %s to a host that did not answer", id)
		}
		return nil
	}
	runs := []Run{
		{ID: "img-1", Bytes: 50}, // only b matches it
		{ID: "img-2", Bytes: 70}, // only a has room (b has 10 left after img-1)
		{ID: "img-3", Bytes: 40}, // a has 30 left, b 10: none has room
		{ID: "tr-1", Transcript: true, Bytes: 5},
	}
	out := Drain(t.Context(), runs, hs, Options{Parallel: 1, Migrate: migrate})
	byRun := map[string]Outcome{}
	for _, o := range out {
		byRun[o.Run] = o
	}
	// tr-1 goes first, to a (100 left against 60).
	if o := byRun["tr-1"]; o.To != a {
		t.Fatalf("tr-1: %+v, want host a (most room)", o)
	}
	if o := byRun["img-1"]; o.To != b {
		t.Fatalf("img-1: %+v, want host b (a's manifest differs)", o)
	}
	if o := byRun["img-2"]; o.To != a {
		t.Fatalf("img-2: %+v, want host a (b has no room left)", o)
	}
	o := byRun["img-3"]
	if !o.To.IsZero() || !errors.Is(o.Err, ErrNoHost) || !errors.Is(o.Err, unreachable) {
		t.Fatalf("img-3: %+v, want no host, with every host's reason", o)
	}
	if len(offered["img-3"]) != 0 || len(offered["img-1"]) != 1 {
		t.Fatalf("offers %v", offered)
	}
}

// A host that refuses a run at its migration gives its room back: the
// run goes to the next, and a later run can still use the room.
func TestDrainRefusedGivesRoomBack(t *testing.T) {
	a, b := host("a"), host("b")
	refused := errors.New("no_space")
	migrate := func(_ context.Context, id string, to record.Address) error {
		if id == "r1" && to == a {
			return refused
		}
		return nil
	}
	hs := []Target{{Key: a, Free: 100}, {Key: b, Free: 90}}
	out := Drain(t.Context(), []Run{{ID: "r1", Bytes: 80}, {ID: "r2", Bytes: 95}}, hs, Options{Parallel: 1, Migrate: migrate})
	if out[0].To != b || out[1].To != a {
		t.Fatalf("%+v", out)
	}
}

// Fit judges a need as the resume on that host would: every recorded key
// against the host's facts, the image by the digest it has under the
// unit's image name; a draining host, or one without image parks for an
// image run, takes nothing.
func TestFit(t *testing.T) {
	facts := manifest.Manifest{manifest.Arch: "x86_64", manifest.CPUFlags: "avx2 avx512f sse4_2", manifest.Protocol: "1",
		manifest.CRIUImages: "criu-images/4.2", manifest.KernelRelease: "6.19.0"}
	o := Offer{Facts: facts, Images: map[string]string{"oracle": "sha256:aa"}, ImageParks: true}
	need := func(arch, digest string) Need {
		return Need{Run: "r", Image: "oracle", ImagePark: true, Manifest: manifest.Manifest{
			manifest.Arch: arch, manifest.CPUFlags: "avx2 sse4_2", manifest.ImageDigest: digest, manifest.UnitID: "u1",
			manifest.CRIUImages: "criu-images/4.2", manifest.KernelRelease: "6.18.0"}}
	}
	fewer := Offer{Facts: maps.Clone(facts), Images: o.Images, ImageParks: true}
	fewer.Facts[manifest.CPUFlags] = "avx2"
	format := Offer{Facts: maps.Clone(facts), Images: o.Images, ImageParks: true}
	format.Facts[manifest.CRIUImages] = "criu-images/4.3"
	if err := Fit(need("x86_64", "sha256:aa"), o); err != nil {
		t.Fatalf("a matching run: %v", err)
	}
	for name, c := range map[string]struct {
		n Need
		o Offer
	}{
		"arch":        {need("aarch64", "sha256:aa"), o},
		"digest":      {need("x86_64", "sha256:bb"), o},
		"no image":    {need("x86_64", "sha256:aa"), Offer{Facts: facts, ImageParks: true}},
		"draining":    {need("x86_64", "sha256:aa"), Offer{Facts: facts, Images: o.Images, ImageParks: true, Draining: true}},
		"image parks": {need("x86_64", "sha256:aa"), Offer{Facts: facts, Images: o.Images}},
		"cpu flags":   {need("x86_64", "sha256:aa"), fewer},
		"criu format": {need("x86_64", "sha256:aa"), format},
	} {
		if err := Fit(c.n, c.o); !errors.Is(err, ErrUnfit) {
			t.Errorf("%s: %v, want ErrUnfit", name, err)
		}
	}
	h := TargetOf(host("a"), o, nil, []Need{need("x86_64", "sha256:aa"), {Run: "other", Image: "oracle", Manifest: manifest.Manifest{manifest.Arch: "riscv64"}}})
	if h.Refuses["r"] != nil || h.Refuses["other"] == nil {
		t.Fatalf("%+v", h.Refuses)
	}
}

// An egress grant fits a host whose ceiling holds it, as the import there
// judges it: beyond the ceiling, on a host granting no egress, or by name
// where the host resolves none, it is refused with ErrUnfit and
// bundle.ErrPolicy (grant_refused); a grant of no egress fits anywhere.
func TestFitEgress(t *testing.T) {
	grant := func(dests ...string) unit.Grants {
		g := unit.Grants{Network: unit.Egress}
		for _, s := range dests {
			d, err := unit.ParseDest(s)
			if err != nil {
				t.Fatal(err)
			}
			g.Egress = append(g.Egress, d)
		}
		return g
	}
	ceiling := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	o := Offer{Images: map[string]string{}, ImageParks: true, EgressAllow: ceiling}
	fits := map[string]struct {
		g unit.Grants
		o Offer
	}{
		"within":    {grant("203.0.113.2/32:8080-8081"), o},
		"no egress": {unit.Grants{Network: unit.Loopback}, Offer{ImageParks: true}},
		"a name":    {grant("example.test:443"), Offer{ImageParks: true, EgressAllow: ceiling, EgressNames: true}},
	}
	for name, c := range fits {
		if err := Fit(Need{Run: "r", ImagePark: true, Grants: c.g}, c.o); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	unfit := map[string]struct {
		g unit.Grants
		o Offer
	}{
		"beyond":         {grant("198.51.100.0/24:80"), o},
		"wider":          {grant("203.0.0.0/16:80"), o},
		"no ceiling":     {grant("203.0.113.2/32:8080"), Offer{ImageParks: true}},
		"name, no names": {grant("example.test:443"), o},
	}
	for name, c := range unfit {
		err := Fit(Need{Run: "r", ImagePark: true, Grants: c.g}, c.o)
		if !errors.Is(err, ErrUnfit) || !errors.Is(err, bundle.ErrPolicy) {
			t.Errorf("%s: %v, want ErrUnfit and bundle.ErrPolicy", name, err)
		}
	}
}

// A refusal quotes another host's words cut short: a hostile offer's or
// manifest's megabyte value costs a drain a few dozen bytes per run.
func TestFitBounded(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	n := Need{Run: "r", Manifest: manifest.Manifest{manifest.Arch: huge, manifest.CPUFeatures: "a"}}
	err := Fit(n, Offer{Facts: manifest.Manifest{manifest.Arch: huge + "y", manifest.CPUFeatures: huge}})
	if !errors.Is(err, ErrUnfit) || len(err.Error()) > 1024 {
		t.Fatalf("%d bytes: %.200v", len(err.Error()), err)
	}
}

// In a rolling upgrade: a format-1 need (an image run parked by a host
// before the per-key rules) fits a newer host's offer, which states the
// CPU both ways; a format-2 need does not fit an older host's offer, which
// has neither cpu.flags nor criu.images: refused with ErrFormat, naming
// the format the run's park records and the one the host there reads.
func TestFitAcrossVersions(t *testing.T) {
	flags := "avx2 fpu sse4_2"
	hash := record.Sum([]byte(flags)).String()
	newer := Offer{Facts: manifest.Manifest{manifest.Arch: "amd64", manifest.CPUFlags: flags, manifest.CPUFeatures: hash,
		manifest.CRIUImages: "criu-images/4.2", manifest.CRIUVersion: "4.2.1"}, Images: map[string]string{"u": "sha256:aa"}, ImageParks: true}
	older := Offer{Facts: manifest.Manifest{manifest.Arch: "amd64", manifest.CPUFeatures: hash, manifest.CRIUVersion: "4.2.1"},
		Images: map[string]string{"u": "sha256:aa"}, ImageParks: true}
	format1 := Need{Run: "r", Image: "u", ImagePark: true, Manifest: manifest.Manifest{manifest.Arch: "amd64",
		manifest.CPUFeatures: hash, manifest.CRIUVersion: "4.2.0", manifest.ImageDigest: "sha256:aa", manifest.UnitID: "u1"}}
	format2 := Need{Run: "r", Image: "u", ImagePark: true, Manifest: manifest.Manifest{manifest.Arch: "amd64",
		manifest.CPUFlags: flags, manifest.CRIUImages: "criu-images/4.2", manifest.CRIUVersion: "4.2.1", manifest.ImageDigest: "sha256:aa", manifest.UnitID: "u1"}}
	if err := Fit(format1, newer); err != nil {
		t.Fatalf("format 1 on a newer host: %v", err)
	}
	if err := Fit(format2, newer); err != nil {
		t.Fatalf("format 2 on a newer host: %v", err)
	}
	err := Fit(format2, older)
	if !errors.Is(err, ErrFormat) || !errors.Is(err, ErrManifest) ||
		!strings.Contains(err.Error(), manifest.Domain+"2") || !strings.Contains(err.Error(), manifest.Domain+"1 only") {
		t.Fatalf("format 2 on an older host: %v", err)
	}
	// A format-2 host that fails a key is not said to be older.
	other := Offer{Facts: maps.Clone(newer.Facts), Images: newer.Images, ImageParks: true}
	other.Facts[manifest.CRIUImages] = "criu-images/4.3"
	if err := Fit(format2, other); !errors.Is(err, ErrManifest) || errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), manifest.CRIUImages+":") {
		t.Fatalf("format 2 on a host of another CRIU format: %v", err)
	}
}
